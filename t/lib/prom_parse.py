#!/usr/bin/python3
"""Parses a Prometheus text exposition from stdin with the reference
client's parser (Debian's python3-prometheus-client) and prints what it
read as JSON, for the Perl tests:

  {"families": [{"name", "type", "help",
                 "samples": [{"name", "labels", "value"}]}]}

A page the parser refuses exits 1 with its message on stderr.
"""

import json
import sys

from prometheus_client.parser import text_string_to_metric_families


def main():
    text = sys.stdin.read()
    out = []
    try:
        for fam in text_string_to_metric_families(text):
            out.append({
                "name": fam.name,
                "type": fam.type,
                "help": fam.documentation,
                "samples": [{"name": s.name, "labels": s.labels,
                             "value": s.value} for s in fam.samples],
            })
    except Exception as e:  # the parser raises ValueError and others
        print("prometheus_client refused the page: %r" % (e,),
              file=sys.stderr)
        return 1
    json.dump({"families": out}, sys.stdout, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
