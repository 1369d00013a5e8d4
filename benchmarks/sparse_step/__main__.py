"""`python -m benchmarks.sparse_step`: see the package's docstring."""

from benchmarks.sparse_step.cli import main

if __name__ == "__main__":
    main()
