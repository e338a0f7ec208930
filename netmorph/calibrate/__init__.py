"""Measure the machine netmorph runs on, so that the planner and the simulator predict its runs.

SimAI, Echo and vTrain get their accuracy by profiling the machine first (real kernels, real
communication); this is the same step for netmorph's ranks: :mod:`~netmorph.calibrate.compute` times the
GEMM shapes of a transformer layer, elementwise passes and the software cost of one operator with every
rank busy at once; :mod:`~netmorph.calibrate.links` fits each link class's α (per message, software
included) and β (per byte) from a ping-pong sweep, as nccl-tests sweeps sizes;
:mod:`~netmorph.calibrate.profile` turns both into the planner's :class:`~netmorph.planner.hardware.Hardware`
fields, with the raw measurements and the fit residuals beside them, in one JSON file
(``netmorph plan estimate --hardware PROFILE.json``).
"""
