"""Running the ``draftsim`` command in-process, for the CLI tests."""

from draftsim.cli import main


def run(capsys, *argv):
    """Run ``draftsim argv`` in-process; return (status, stdout, stderr)."""
    try:
        status = main(list(argv))
    except SystemExit as exc:  # argparse usage errors and --help
        status = exc.code
    out = capsys.readouterr()
    return status, out.out, out.err
