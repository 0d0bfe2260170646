"""_state -- a session's bookkeeping that the fast paths and the Session share.

``SessionState`` is what the C accelerator's ``tensordd._speedups.SessionState`` is, in pure
Python: the same fields (``FIELDS``), the same defaults, no others (``__slots__``). A Session
keeps one (``Session._state``); its attributes ``_open``, ``_pending_release``, ``_ids``, ...
delegate to it, so the accelerator reads and writes a struct of its own instead of the
Session's private attributes, and a field renamed here or there fails loudly
(tests/python/client/test_session_state.py holds the two to each other). ``tensordd._codec`` hands
out the accelerator's when it is built, else this one.
"""
from __future__ import annotations

import itertools

__all__ = ["SessionState"]


class SessionState:
    """The fields, in the accelerator's order:

    open             the session is usable (only True counts)
    capturing        a graph is being recorded: releases wait
    busy             inside a round trip
    memfd            downloads may come as a memfd
    deferred         asynchronous failures, raised by the next synchronising call
    ids              the request id counter (an iterator)
    handles          the handle counter (an iterator)
    calls            request id -> what it was
    pending_release  handles to release with the next request
    conn             the Connection
    """

    FIELDS = ("open", "capturing", "busy", "memfd", "deferred", "ids", "handles", "calls",
              "pending_release", "conn")
    __slots__ = FIELDS

    def __init__(self):
        self.open = False
        self.capturing = False
        self.busy = False
        self.memfd = False
        self.deferred = []
        self.ids = itertools.count(1)
        self.handles = itertools.count(1)
        self.calls = {}
        self.pending_release = []
        self.conn = None
