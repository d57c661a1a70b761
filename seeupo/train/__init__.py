"""Config, trainer loop, algorithm drivers, warm-up, checkpoints and metric logging."""
