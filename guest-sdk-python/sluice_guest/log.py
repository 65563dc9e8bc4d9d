"""Log lines into the host's log, tagged with the plugin's digest
(``sluice:plugin/log``). The host keeps at most 200 lines of 4 KiB per
call and 1,000 per second per instance; more are counted as dropped."""

from ._host import host


def trace(message: str) -> None:
    """Log at TRACE."""
    host().log("trace", str(message))


def debug(message: str) -> None:
    """Log at DEBUG."""
    host().log("debug", str(message))


def info(message: str) -> None:
    """Log at INFO."""
    host().log("info", str(message))


def warn(message: str) -> None:
    """Log at WARN."""
    host().log("warn", str(message))


def error(message: str) -> None:
    """Log at ERROR."""
    host().log("error", str(message))
