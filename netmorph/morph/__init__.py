"""Adaptive parallelism: move the live training state between layouts (:mod:`.reshard`, planned on
:mod:`.layouts`' element maps)."""
