"""One module per ``crl`` subcommand: ``add_arguments(parser)`` and ``run(args)``."""
