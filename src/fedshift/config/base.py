"""What every config section shares: unknown keys are errors, assignments are validated, and a
concept is named by its index into ``scenario.concepts``."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

#: an index into scenario.concepts (0 is the first; a negative index is an error, not Python's
#: count from the end)
ConceptIndex = Annotated[int, Field(ge=0)]


class Strict(BaseModel):
    """Base for config sections: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
