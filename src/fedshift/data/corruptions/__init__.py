"""Image corruptions for feature shift, each a function ``f(x, severity, rng)`` of float32
images ``x`` [N, H, W, C] on ``[0, 1]`` and a severity 1..5, registered in
:data:`CORRUPTION_FUNCS` by name. Use them through :mod:`fedshift.data.features`
(:func:`~fedshift.data.features.apply_corruption`, feature styles), which converts from and to
``uint8`` and lists the names in order (:data:`~fedshift.data.features.CORRUPTIONS`).

Corruptions follow the CIFAR-10-C families (Hendrycks & Dietterich, 2019; :mod:`.cifar10c`):
noise (gaussian, shot, impulse, speckle), blur (defocus, gaussian, motion, zoom, glass), weather
(snow, frost, fog, spatter) and digital (brightness, contrast, saturate, pixelate,
jpeg_compression, elastic_transform); and the FMNIST-C / MNIST-C ones (Mu & Gilmer, 2019;
:mod:`.fmnistc`): identity (no change), geometric (shear, scale, rotate, translate), overlays
(stripe, dotted_line, zigzag) and canny_edges. Each has five severities. The code is written
from scratch with numpy, scipy.ndimage and Pillow (shared helpers: :mod:`.ops`); the severity
tables reuse the published CIFAR-10-C constants where those are monotonic, and use our own
tables otherwise, because here **the mean distance from the clean image never decreases with
the severity** (see each function; ``identity`` stays at distance 0). ``frost`` blends a
procedural texture, not the published frost photographs.

Conventions:

* Work is done in float32 on ``[0, 1]``; the result is rounded and clipped back to ``uint8``.
* Constants are for 32x32 images and used as they are for smaller images (28x28, 16x16, 8x8);
  pixel-sized parameters (sigmas, radii, offsets) are multiplied by ``size / 32`` for larger ones.
* Randomness comes only from the ``rng`` argument. Noise fields, angles, offsets, masks and lines
  are drawn the same way at every severity and only scaled or thresholded differently, so with
  one seed the severities are nested (exceptions: ``shot_noise``, being Poisson, and
  ``glass_blur``, whose extra iterations draw extra offsets). ``identity`` and ``canny_edges``
  draw nothing.
* Grayscale images: colour corruptions act on the one channel. ``brightness`` adds to the value
  (= the grey level), ``saturate`` has no chroma to act on and stretches the tones away from
  mid-grey instead, ``spatter`` and ``frost`` use the luminance of their colours, and
  ``snow`` greys towards the value itself. RGB ``canny_edges`` finds the edges of the
  luminance and writes them to every channel.
"""

from fedshift.data.corruptions import cifar10c, fmnistc  # noqa: F401  (they register on import)
from fedshift.data.corruptions.registry import CORRUPTION_FUNCS, Corruption

__all__ = ["CORRUPTION_FUNCS", "Corruption"]
