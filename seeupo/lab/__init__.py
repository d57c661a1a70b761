"""The tabular convergence lab: exact and sampled runs of every algorithm on small token trees."""
