"""Parallel training on real ranks: DP, ZeRO, Megatron TP (+SP), pipeline schedules, composed as 3D."""
