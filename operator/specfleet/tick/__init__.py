"""The pure tick: (SpecModel, status, what was watched and measured, the clock) -> what to serve,
the status, the children and the actions. No I/O: `controller/` runs it, `specfleet simulate`
replays it."""
