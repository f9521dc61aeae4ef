"""Walking the nested values the engine passes around (states, tasks, results: dicts, lists,
tuples and dataclasses of tensors): every tensor of one, or a copy on another device."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch


def tensors(tree: Any) -> Iterator[torch.Tensor]:
    """Every tensor in ``tree`` (nested dicts, lists, tuples and dataclass instances)."""
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from tensors(v)
    elif isinstance(tree, list | tuple):
        for v in tree:
            yield from tensors(v)
    elif dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        for f in dataclasses.fields(tree):
            yield from tensors(getattr(tree, f.name))


def float_tensors(tree: Any) -> Iterator[torch.Tensor]:
    """The floating-point tensors of a state."""
    return (t for t in tensors(tree) if torch.is_floating_point(t))


def move(tree: Any, device: torch.device, memo: dict[int, torch.Tensor] | None = None) -> Any:
    """``tree`` with its tensors on ``device`` (the same objects where nothing moves); a tensor
    met twice becomes one tensor again, so values that shared a model still share it (the
    batched executor passes a model its clients share once)."""
    memo = {} if memo is None else memo
    if isinstance(tree, torch.Tensor):
        if tree.device == device:
            return tree
        if id(tree) not in memo:
            memo[id(tree)] = tree.to(device)
        return memo[id(tree)]
    if isinstance(tree, dict):
        return {k: move(v, device, memo) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(move(v, device, memo) for v in tree)
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        fields = dataclasses.fields(tree)
        return dataclasses.replace(
            tree, **{f.name: move(getattr(tree, f.name), device, memo) for f in fields}
        )
    return tree
