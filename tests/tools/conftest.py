"""Synthetic features and images shared by the probe tests: clients whose features differ by
a client offset, labels carried by a client's own embedding, and a renderer that paints the
same content in several colours."""

import pytest
import torch


def client_features(clients: int, per_client: int, dim: int = 16, seed: int = 0):
    """(a, b, client) for ``clients`` clients: a and b are the client's own offset plus
    independent noise each, so a pair shares only its client."""
    g = torch.Generator().manual_seed(seed)
    client = torch.arange(clients).repeat_interleave(per_client)
    offset = 3.0 * torch.randn(clients, dim, generator=g)
    a = offset[client] + torch.randn(len(client), dim, generator=g)
    b = offset[client] + torch.randn(len(client), dim, generator=g)
    return a, b, client


def labelled_clients(clients: int, per_client: int, classes: int = 5, dim: int = 16, seed=0):
    """Features of ``clients`` clients with labels: ``x`` carries the label through an
    embedding of the client's own (a different network per client) plus noise; ``noise``
    carries only the client. A dict like a split of ``client_features`` in probes."""
    g = torch.Generator().manual_seed(seed)
    client = torch.arange(clients).repeat_interleave(per_client)
    y = torch.randint(0, classes, (len(client),), generator=g)
    embed = torch.randn(clients, classes, dim, generator=g)
    x = embed[client, y] + 0.3 * torch.randn(len(client), dim, generator=g)
    noise = torch.randn(clients, dim, generator=g)[client] + torch.randn(len(client), dim)
    return {"x": x, "noise": noise, "y": y, "client": client}


class ColourWorld:
    """Grey "images" (a label's pattern plus noise, ``[N, 1, 4, 4]``) and a renderer whose
    inputs put the content in the first 16 entries and the colour's code in the last 8."""

    def __init__(self, colours: int = 4, classes: int = 4, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.patterns = torch.rand(classes, 1, 4, 4, generator=g)
        self.codes = 5.0 * torch.randn(colours, 8, generator=g)
        self.rotations = [
            torch.linalg.qr(torch.randn(16, 16, generator=g))[0] for _ in range(colours)
        ]
        self.classes, self.g = classes, g

    def images(self, n: int):
        y = torch.randint(0, self.classes, (n,), generator=self.g)
        m = (self.patterns[y] + 0.1 * torch.randn(n, 1, 4, 4, generator=self.g)).clamp(0, 1)
        return m, y

    def render(self, m: torch.Tensor, k: int) -> torch.Tensor:
        return torch.cat([m.flatten(1), self.codes[k].expand(len(m), 8)], dim=1)

    @staticmethod
    def content_only(x: torch.Tensor) -> torch.Tensor:
        return x[:, :16]

    @staticmethod
    def colour_only(x: torch.Tensor) -> torch.Tensor:
        return x[:, 16:]

    def entangled(self, x: torch.Tensor) -> torch.Tensor:
        """The content turned by a rotation of the colour's own (it reads the digit, but
        differently in every colour)."""
        k = torch.cdist(x[:, 16:], self.codes).argmin(1)
        turned = torch.stack([self.rotations[int(i)] for i in k])
        return torch.einsum("nij,nj->ni", turned, x[:, :16])


@pytest.fixture
def colour_world() -> ColourWorld:
    return ColourWorld()
