"""Launchers that start specdraft jobs on clusters (SLURM)."""
