"""An in-process stand-in for Flower's ``Grid``: nodes are ClientApp calls in this process
(each with its own node config), so a deployment's server and nodes run in one test without
a SuperLink. Every reply is kept for inspection; a node can be taken down (its messages are
lost, as when a SuperNode is killed) and brought back."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from flwr.app import Context, Error, Message, RecordDict


class InProcessNodes:
    def __init__(self, app: Any, node_configs: dict[int, dict[str, Any]]) -> None:
        self.app = app
        self.contexts = {
            nid: Context(run_id=1, node_id=nid, node_config=cfg, state=RecordDict(), run_config={})
            for nid, cfg in node_configs.items()
        }
        self.inbox: dict[str, Message] = {}
        self.replies: list[tuple[Message, Message]] = []  # (message, reply) as sent by nodes
        self.down: set[int] = set()
        self.lost: list[Message] = []  # train messages whose reply was lost
        self.lose_next: dict[int, int] = {}  # node -> messages of a kind to lose

    def get_node_ids(self) -> list[int]:
        return [n for n in self.contexts if n not in self.down]

    def push_messages(self, messages) -> list[str]:
        ids = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = str(uuid4())
            self.inbox[m.metadata.message_id] = m
            ids.append(m.metadata.message_id)
        return ids

    def pull_messages(self, message_ids) -> list[Message]:
        out = []
        for mid in list(message_ids):
            m = self.inbox.pop(mid, None)
            if m is None:
                continue
            node = m.metadata.dst_node_id
            if node in self.down:
                continue  # lost with the node
            if m.metadata.message_type == "train" and self.lose_next.get(node, 0) > 0:
                self.lose_next[node] -= 1  # the node trains, then dies before replying
                self.app(m, self.contexts[node])
                self.lost.append(m)
                continue
            try:
                reply = self.app(m, self.contexts[node])
            except Exception as err:  # noqa: BLE001 - Flower turns it into an error reply
                reply = Message(Error(code=0, reason=f"{type(err).__name__}: {err}"), reply_to=m)
            reply.metadata.__dict__["_src_node_id"] = node
            self.replies.append((m, reply))
            out.append(reply)
        return out
