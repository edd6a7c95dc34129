"""The part of Sorted Containers 2.4.0 (Grant Jenks, Apache-2.0: LICENSE beside this
file) that DynaPipe's allocation_simulator.py imports: sortedlist.py, unchanged."""
from .sortedlist import SortedList, SortedKeyList

__all__ = ["SortedList", "SortedKeyList"]
