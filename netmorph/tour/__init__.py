"""The tour's experiments: what ``netmorph tour`` runs, one module per section, each a ``run(tick, quick)`` that
calls its package's experiment functions and returns a typed result. :mod:`netmorph.report` only draws them."""
