"""One module per algorithm; each holds the algorithm's single `DEFINITION`."""
