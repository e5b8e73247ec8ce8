"""One module per group of subcommands; each exposes ``register(subparsers, common)``.
:mod:`draftsim.commands.table` names every command, its group, summary and module, so the
command line imports only the module of the command that runs."""
