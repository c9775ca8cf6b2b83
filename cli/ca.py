"""``nearshore ca``: make a cluster CA and issue edge and node certificates from it.

nearshore ca init --dir ca/
nearshore ca issue london --dir ca/ --out certs/ --server --host london.internal --host 10.0.0.5
nearshore ca issue edge-lagos --dir ca/ --out certs/ --client
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nearshore.tls import create_cluster_ca, issue_certificate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="ca_action", required=True, metavar="ACTION")

    init = actions.add_parser(
        "init",
        help="create the cluster CA (ca.pem, ca-key.pem)",
        description="Create the CA that signs the cluster's edge and regional-node certificates.",
    )
    init.add_argument("--dir", required=True, type=Path, metavar="DIR", help="folder for the CA files")
    init.add_argument("--name", default="Nearshore cluster CA", help="the CA's common name")
    init.add_argument("--force", action="store_true", help="replace an existing CA")

    issue = actions.add_parser(
        "issue",
        help="issue a certificate signed by the cluster CA",
        description="Issue NAME.pem and NAME-key.pem, signed by the CA in DIR. --server for a regional "
        "node (serverAuth), --client for an edge (clientAuth), or both.",
    )
    issue.add_argument("name", metavar="NAME", help="common name, also the file name")
    issue.add_argument("--dir", required=True, type=Path, metavar="DIR", help="folder of the cluster CA")
    issue.add_argument("--out", required=True, type=Path, metavar="OUTDIR", help="folder for the new files")
    issue.add_argument(
        "--host",
        action="append",
        dest="hosts",
        metavar="H",
        help="a DNS name or IP address the certificate is valid for (repeatable; "
        "default: localhost and 127.0.0.1)",
    )
    issue.add_argument("--client", action="store_true", help="usable as a client certificate (edges)")
    issue.add_argument("--server", action="store_true", help="usable as a server certificate (nodes)")


def run(args: argparse.Namespace) -> int:
    try:
        if args.ca_action == "init":
            paths = create_cluster_ca(args.dir, args.name, force=args.force)
        else:
            hosts = args.hosts if args.hosts is not None else ("localhost", "127.0.0.1")
            paths = issue_certificate(
                args.dir, args.name, args.out, hosts, client=args.client, server=args.server
            )
    except (FileExistsError, FileNotFoundError, ValueError) as exc:
        print(f"nearshore ca {args.ca_action}: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nearshore ca", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
