"""The multi-turn episode runner and generation backends."""
