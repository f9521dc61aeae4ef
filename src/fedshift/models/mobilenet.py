"""torchvision's MobileNetV2 as a :class:`SplitModel`.

Body = ``features`` + global average pool + flatten (feature_dim 1280); head = the original
classifier, ``Dropout(0.2)`` + ``Linear(1280, num_classes)``. Inputs with a channel count other than
3 get a new first conv. ``norm="group"`` swaps every BatchNorm for ``GroupNorm(2, C)``.
torchvision is imported only when a MobileNet is built.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from fedshift.models import MODELS
from fedshift.models.base import (
    SplitModel,
    check_norm,
    copy_matching,
    image_shape,
    make_norm2d,
)
from fedshift.models.pretrained import download_state_dict, report_loading


@MODELS.register("mobilenet_v2")
def build_mobilenet_v2(
    num_classes: int,
    input_shape: tuple[int, ...],
    *,
    norm: str = "batch",
    pretrained: bool = False,
) -> SplitModel:
    """MobileNetV2 (width multiplier 1.0) for images of any size >= 1 pixel after 32x striding."""
    from torchvision.models import mobilenet_v2

    c, _, _ = image_shape("mobilenet_v2", input_shape)
    check_norm(norm)
    net = mobilenet_v2(weights=None, num_classes=num_classes, norm_layer=_norm_layer(norm))
    stem = net.features[0][0]
    if c != stem.in_channels:
        new_stem = nn.Conv2d(
            c,
            stem.out_channels,
            kernel_size=stem.kernel_size,
            stride=stem.stride,
            padding=stem.padding,
            bias=False,
        )
        nn.init.kaiming_normal_(new_stem.weight, mode="fan_out")
        net.features[0][0] = new_stem
    for m in net.modules():  # vmap / functional_call friendliness: no in-place activations
        if isinstance(m, (nn.ReLU, nn.ReLU6)):
            m.inplace = False
    body = nn.Sequential(net.features, nn.AdaptiveAvgPool2d(1), nn.Flatten())
    feature_dim = net.last_channel
    model = SplitModel(body, net.classifier, feature_dim, num_classes)
    if pretrained:
        load_imagenet_mobilenet_v2(model)
    return model


def _norm_layer(norm: str) -> Callable[[int], nn.Module]:
    """Factory ``channels -> norm layer`` for torchvision's ``norm_layer`` argument."""

    def factory(channels: int) -> nn.Module:
        return make_norm2d(norm, channels)

    return factory


def load_imagenet_mobilenet_v2(model: SplitModel) -> tuple[list[str], list[str]]:
    """Copy torchvision's ImageNet MobileNetV2 weights into the body (classifier not loaded).

    For a 1-channel first conv the RGB filters are summed over the colour channels, so a grey image
    gives the response of the same image in RGB. Returns ``(loaded, skipped)`` target keys.
    """
    from torchvision.models import MobileNet_V2_Weights

    source = download_state_dict("mobilenet_v2", MobileNet_V2_Weights.IMAGENET1K_V1.url)
    stem_key = "features.0.0.weight"
    stem = model.body[0][0][0]
    if stem_key in source and stem.in_channels == 1 and source[stem_key].shape[1] == 3:
        source = dict(source)
        source[stem_key] = source[stem_key].sum(dim=1, keepdim=True)
    key_map = {k: f"body.0.{k[len('features.') :]}" for k in source if k.startswith("features.")}
    loaded, skipped = copy_matching(model, source, key_map)
    report_loading("mobilenet_v2", loaded, skipped)
    return loaded, skipped
