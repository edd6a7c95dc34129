"""Type stubs of allocsim's native module (the Rust side; see allocsim/__init__.py)."""

from typing import List, Optional, Sequence, Tuple, Union
import os

__version__: str

class TraceError(ValueError):
    """A trace that cannot be read or replayed: the message names the file (or the
    snapshot given in memory) and the line, event or entry."""

class ConfigError(ValueError):
    """Settings that do not make a run."""

class ReplayError(RuntimeError):
    """A replay stopped by something other than running out of memory."""

_Trace = Union[str, "os.PathLike[str]", Tuple[str, bytes]]

def replay(trace: _Trace, options: str) -> Tuple[str, Optional[bytes]]: ...
def compare(traces: Sequence[_Trace], options: str) -> Tuple[str, List[Tuple[str, str]]]: ...
def fit(traces: Sequence[_Trace], options: str) -> str: ...
def sweep(
    text: str, path: Union[str, "os.PathLike[str]"], traces: Sequence[Union[str, "os.PathLike[str]"]], options: str
) -> Tuple[str, str, List[Tuple[str, Optional[int]]]]: ...
def sweep_rows(
    text: str, path: Union[str, "os.PathLike[str]"], traces: Sequence[Union[str, "os.PathLike[str]"]]
) -> int: ...
def merge(shards: Sequence[Tuple[str, str]]) -> Tuple[str, str]: ...
def policy_names() -> List[str]: ...
def gpu_profiles() -> List[str]: ...
