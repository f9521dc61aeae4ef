"""CIFAR-style ResNet-18: 3x3 stride-1 stem, no max-pool, BasicBlocks [2, 2, 2, 2].

``norm="batch"`` uses BatchNorm2d; ``norm="group"`` uses ``GroupNorm(2, C)`` in every layer, the
usual choice in federated learning (GroupNorm keeps no running statistics, so it behaves the same
in train and eval mode and under ``torch.func.vmap``). ``block_norm=False`` replaces the two
normalisation layers inside every residual branch by identities and keeps them in the stem and
in the downsampling shortcuts: the FedNH code's ``BasicBlockNoNorm`` (``--no_norm``), which it
used for FedNH on Tiny-ImageNet.

Module names follow torchvision's ResNet (``conv1``, ``bn1``, ``layer1.0.conv1``, ``downsample``,
...; the ``bn*`` modules are GroupNorm layers when ``norm="group"``), so torchvision's ImageNet
weights map onto the body one to one, except the 7x7 stem conv, which is skipped.
"""

from __future__ import annotations

from torch import Tensor, nn

from fedshift.core.errors import FedshiftError
from fedshift.models import MODELS
from fedshift.models.base import SplitModel, copy_matching, image_shape, make_norm2d
from fedshift.models.pretrained import download_state_dict, report_loading

DEFAULT_WIDTH = 64


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (1x1 conv shortcut when shapes change)."""

    def __init__(
        self, in_channels: int, channels: int, stride: int, norm: str, block_norm: bool = True
    ) -> None:
        super().__init__()
        branch_norm = (lambda c: make_norm2d(norm, c)) if block_norm else (lambda c: nn.Identity())
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = branch_norm(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = branch_norm(channels)
        self.relu = nn.ReLU()
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False),
                make_norm2d(norm, channels),
            )

    def forward(self, x: Tensor) -> Tensor:
        """Residual block forward pass (no in-place operations)."""
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNetBody(nn.Module):
    """ResNet-18 feature extractor returning globally average-pooled features ``[B, 8*width]``."""

    def __init__(
        self, in_channels: int, norm: str, width: int = DEFAULT_WIDTH, block_norm: bool = True
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, stride=1, padding=1, bias=False)
        self.bn1 = make_norm2d(norm, width)
        self.relu = nn.ReLU()
        channels = width
        stages = []
        for i, stride in enumerate((1, 2, 2, 2)):
            out_channels = width * 2**i
            stages.append(
                nn.Sequential(
                    BasicBlock(channels, out_channels, stride, norm, block_norm),
                    BasicBlock(out_channels, out_channels, 1, norm, block_norm),
                )
            )
            channels = out_channels
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.out_dim = channels
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        """Map images ``[B, C, H, W]`` to features ``[B, out_dim]``."""
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.flatten(self.avgpool(x))


@MODELS.register("resnet18")
def build_resnet18(
    num_classes: int,
    input_shape: tuple[int, ...],
    *,
    norm: str = "batch",
    width: int | None = None,
    pretrained: bool = False,
    block_norm: bool = True,
) -> SplitModel:
    """CIFAR-style ResNet-18; ``width`` is the stem width (default 64, feature_dim = 8*width);
    ``block_norm=False``: no normalisation inside the residual branches (see the module doc)."""
    c, _, _ = image_shape("resnet18", input_shape)
    width = DEFAULT_WIDTH if width is None else int(width)
    if width <= 0:
        raise FedshiftError(f"model width must be positive, got {width}")
    if pretrained and width != DEFAULT_WIDTH:
        raise FedshiftError(
            f"pretrained resnet18 weights need width {DEFAULT_WIDTH}, got {width}; "
            "drop model.width or set model.pretrained=false"
        )
    body = ResNetBody(c, norm, width, block_norm)
    model = SplitModel(body, nn.Linear(body.out_dim, num_classes), body.out_dim, num_classes)
    if pretrained:
        load_imagenet_resnet18(model)
    return model


def load_imagenet_resnet18(model: SplitModel) -> tuple[list[str], list[str]]:
    """Copy torchvision's ImageNet ResNet-18 weights into the body (shape-matching tensors only).

    The classifier (``fc``) is never loaded; the 7x7 stem conv does not fit the 3x3 stem and is
    skipped. With ``norm="group"`` the BatchNorm affine parameters go into the GroupNorm layers and
    the running statistics are dropped. Returns ``(loaded, skipped)`` target keys.
    """
    from torchvision.models import ResNet18_Weights

    source = download_state_dict("resnet18", ResNet18_Weights.IMAGENET1K_V1.url)
    key_map = {k: f"body.{k}" for k in source if not k.startswith("fc.")}
    loaded, skipped = copy_matching(model, source, key_map)
    report_loading("resnet18", loaded, skipped)
    return loaded, skipped
