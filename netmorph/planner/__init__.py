"""The parallelism planner: model and hardware presets, memory and step-time formulas, the search
(:mod:`.model`, :mod:`.hardware`, :mod:`.memory`, :mod:`.timing`, :mod:`.search`)."""
