"""CLI subcommands: each module here defines `register(subparsers)`; moespac.cli discovers them all."""
