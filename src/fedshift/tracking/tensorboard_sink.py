"""TensorBoard: event files in ``<run dir>/tensorboard/`` (``tensorboard --logdir runs/``
shows every run by its folder, a sweep's runs under the sweep's folder).

Scalars at step = round; the config as hyper-parameters (the HParams dashboard) and as text;
figures as images; summary.json as text; the group, if any, as the text ``fedshift/group``.
A resumed run writes a new event file in the same folder whose first event purges the steps
after the checkpoint, which the resumed run logs again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter

from fedshift.core.errors import FedshiftError
from fedshift.tracking.common import RunInfo, remove_stale

#: the folder of the event files, inside the run directory
FOLDER = "tensorboard"


class TensorBoardSink:
    rewinds = True

    def __init__(self) -> None:
        self.writer: SummaryWriter | None = None

    def start(self, run: RunInfo, saved: dict[str, Any] | None, resumed: int) -> dict:
        logdir = run.run_dir / FOLDER
        try:
            if saved is None:
                remove_stale(logdir)
            # purge_step: TensorBoard hides the events at this step and later of earlier files
            purge = None if saved is None else resumed + 1
            self.writer = SummaryWriter(str(logdir), purge_step=purge)
            if saved is None and run.group:
                self.writer.add_text("fedshift/group", run.group, 0)
        except OSError as err:
            why = err.strerror or str(err)
            raise FedshiftError(
                f"log: tensorboard cannot write its folder {logdir} ({why}); make it (and "
                "the run folder) writable, or give another output.dir"
            ) from None
        return {"logdir": FOLDER}

    def params(self, params: dict[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        assert self.writer is not None
        for summary in hparams(params, {}):  # experiment, session start, session end
            self.writer.file_writer.add_summary(summary)
        lines = "\n".join(f"    {k}: {v}" for k, v in params.items())  # a markdown code block
        self.writer.add_text("config", lines, 0)
        self.writer.flush()

    def metrics(self, values: dict[str, float], step: int) -> None:
        assert self.writer is not None
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()  # the step is in the file before tracking.json says so

    def images(self, images: dict[str, Path], step: int) -> None:
        """The PNG files as they are (TensorBoard's image summaries hold encoded images)."""
        from PIL import Image
        from tensorboard.compat.proto.summary_pb2 import Summary

        assert self.writer is not None
        for tag, path in images.items():
            with Image.open(path) as im:
                (width, height), channels = im.size, len(im.getbands())
            image = Summary.Image(
                height=height,
                width=width,
                colorspace=channels,
                encoded_image_string=Path(path).read_bytes(),
            )
            self.writer.file_writer.add_summary(
                Summary(value=[Summary.Value(tag=tag, image=image)]), step
            )
        self.writer.flush()

    def summary(self, summary: dict[str, Any], step: int) -> None:
        assert self.writer is not None
        text = json.dumps(summary, indent=2, default=str)
        self.writer.add_text("summary", "\n".join(f"    {x}" for x in text.splitlines()), step)
        self.writer.flush()

    def close(self, status: str) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
