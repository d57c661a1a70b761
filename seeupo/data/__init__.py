"""Episodes and their row views (trajectory rows, turn pools)."""
