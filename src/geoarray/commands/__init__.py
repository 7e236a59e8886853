"""Subcommands of the ``geoarray`` command line, one module per command family.

Each module registers its parsers on the tree built by :mod:`geoarray.cli` and sets
``parser.set_defaults(func=run)`` with ``run(args) -> int``. Building the parsers imports no
torch, jax, matplotlib or scikit-learn; the run functions import what they need.
"""
