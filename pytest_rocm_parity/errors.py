"""One exception root for everything the plugin raises on purpose.

Errors caused by user input also subclass ValueError/TypeError so that generic
handlers keep working.  Every message says what happened, why, and the fix.
"""
from __future__ import annotations


class ParityError(Exception):
    """Root of the plugin's own errors."""


class InvalidArgument(ParityError, ValueError):
    """A bad argument to a public function (names the argument and the allowed values)."""


class GoldenError(ParityError):
    """Anything wrong with a golden bundle on disk; always names the file."""

    def __init__(self, message: str, path: object = None) -> None:
        super().__init__(message)
        self.path = path


class GoldenMissing(GoldenError):
    """No golden exists for this check: capture one on the reference machine."""


class GoldenCorrupt(GoldenError, ValueError):
    """The golden's bytes cannot be trusted (truncated, bad header, unknown dtype, hostile)."""


class GoldenTooNew(GoldenError):
    """The golden was written by a newer pytest-rocm-parity; upgrade the plugin (regenerating with
    this one would downgrade the golden for everyone)."""


class GoldenStale(GoldenError):
    """The golden was valid but describes another model, layer list, shapes or inputs."""


class GoldenExists(GoldenError):
    """Capture refused to overwrite a golden; regeneration is explicit (--parity-regen)."""


class GoldenWriteError(GoldenError, OSError):
    """Writing a golden failed (disk full, permission); the previous golden is intact."""


class WriteForbidden(GoldenError):
    """Goldens are not written in CI unless --parity-allow-write is given."""


class BackendUnavailable(ParityError):
    """The requested device or backend is not present on this machine."""


class LayerSelectionError(InvalidArgument):
    """A ``layers=`` pattern matched no module of the model."""


class InputError(InvalidArgument):
    """Model inputs are malformed (shapes, vocabulary, masks)."""


class CaptureError(ParityError):
    """The golden cannot be recorded as asked (a module that cannot run in float64 here, a truth
    that is not finite where the reference is); nothing was written."""


class ReferenceChange(GoldenError):
    """A regeneration would replace a golden captured on another device kind or torch major version."""


class DuplicateCheckName(InvalidArgument):
    """Two checks in one run use one name, so they would share (and overwrite) one golden."""


class BackwardError(ParityError):
    """A training check's backward raised inside the model (an op with no backward formula, a custom
    autograd function that fails); names the module it raised in."""
