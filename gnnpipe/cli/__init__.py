"""The ``gnnpipe`` command line (see :mod:`gnnpipe.cli.main`)."""
