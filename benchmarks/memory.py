"""What a process holds and what its steps add, from Linux's `/proc`.

`resident_mib("VmRSS")` is the resident set now, `resident_mib("VmHWM")` its
peak since the last `reset_peak()` (writing 5 to `/proc/self/clear_refs`).
Elsewhere both give NaN and `reset_peak` False: the harnesses print NaN
rather than a number they could not measure. `PeakAbove` measures how far
the steps run inside it raise the peak above the resident set at its start.
"""

from __future__ import annotations

__all__ = ["PeakAbove", "reset_peak", "resident_mib"]


def resident_mib(field: str) -> float:
    """`VmRSS` or `VmHWM` of this process, in MiB (Linux), or NaN."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def reset_peak() -> bool:
    """Resets the peak resident set (`VmHWM`) to the resident set now;
    False where that cannot be done."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        return True
    except OSError:
        return False


class PeakAbove:
    """`with PeakAbove() as peak:` around the steps: `peak.resident` is the
    resident set when entered, `peak.added` (after the block) how far the
    peak rose above it, in MiB (NaN where the peak cannot be reset)."""

    def __enter__(self) -> "PeakAbove":
        self.resident = resident_mib("VmRSS")
        self._reset = reset_peak()
        self.added = float("nan")
        return self

    def __exit__(self, *exception: object) -> None:
        if self._reset:
            self.added = resident_mib("VmHWM") - self.resident
