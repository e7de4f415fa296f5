"""The one error hierarchy of tullax: every mistake a user can make is a TullaxError (a ValueError)."""
from __future__ import annotations


class TullaxError(ValueError):
    """Base class of every error tullax raises on purpose."""


class SpecError(TullaxError):
    """The spec text is malformed or asks for something tullax cannot do.

    With ``spec`` and ``column`` the message shows the spec with a caret under the offending column.
    """

    def __init__(self, message: str, spec: str | None = None, column: int | None = None):
        self.message = message
        self.spec = spec
        self.column = column
        super().__init__(self._render())

    def _render(self) -> str:
        if self.spec is None:
            return self.message
        lines = [self.message, "    " + self.spec]
        if self.column is not None:
            lines.append("    " + " " * self.column + "^")
        return "\n".join(lines)


class ShapeError(TullaxError):
    """Arrays do not fit the spec: wrong count, rank, extent, dtype or out-of-range indices."""


class BackendUnavailableError(TullaxError):
    """The requested backend is unknown or cannot run on this machine; the message says how to fix it."""


class UnservedPlatformError(BackendUnavailableError):
    """A kernel on a named backend cannot be lowered for the platform asked for (another platform than this
    process computes on, several at once, or an export: ``tullax.jaxop.target``)."""


def with_spec_context(err: TullaxError, spec_text: str) -> TullaxError:
    """Attach the spec text to an error raised below the API boundary (done once, at the boundary)."""
    if isinstance(err, SpecError) and err.spec is None:
        return SpecError(err.message, spec_text, err.column)
    if not isinstance(err, SpecError) and spec_text not in str(err):
        new = type(err)(f"{err}\n    in spec: {spec_text}")
        return new
    return err
