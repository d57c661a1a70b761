"""Experiments as a feature: ``seeupo sweep`` (a grid of ordinary runs on an Optuna study) and
``seeupo report`` (results.json, report.md and plots with bootstrap confidence intervals)."""
