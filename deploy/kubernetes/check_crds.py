"""Validates the custom resources of deploy/kubernetes/*.yaml (the kinds Kubernetes itself does
not define, which kubernetes-validate skips) against the JSON schemas in schemas/, and checks
that each manifest of schemas/invalid/ is refused, so the check can fail.

    python deploy/kubernetes/check_crds.py    # in a venv with jsonschema and PyYAML

Exits 1 naming the document and the field at fault; a document of a custom API group with no
schema here is an error too.
"""

import functools
import json
import sys
from pathlib import Path

import jsonschema
import yaml

HERE = Path(__file__).resolve().parent
SCHEMAS = {
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepool-v1.json",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute-v1.json",
}
# API groups Kubernetes does not define: their kinds need a schema here.
CUSTOM_GROUPS = ("inference.networking.k8s.io", "inference.networking.x-k8s.io",
                 "gateway.networking.k8s.io")


@functools.cache
def validator(api_version, kind):
    name = SCHEMAS.get((api_version, kind))
    if name is None:
        return None
    schema = json.loads((HERE / "schemas" / name).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def problems(path):
    """[(document, message)] for each custom resource of `path` its schema refuses."""
    out = []
    for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
        if not doc:
            continue
        api_version, kind = doc.get("apiVersion", ""), doc.get("kind", "")
        where = "%s #%d (%s %s)" % (path.relative_to(HERE.parent.parent), i + 1, api_version, kind)
        check = validator(api_version, kind)
        if check is None:
            if api_version.split("/")[0] in CUSTOM_GROUPS:
                out.append((where, "no schema for this kind in deploy/kubernetes/schemas"))
            continue
        for err in check.iter_errors(doc):
            field = "/".join(str(p) for p in err.absolute_path) or "(document)"
            out.append((where, "%s: %s" % (field, err.message)))
    return out


def main():
    failed = False
    checked = 0
    for path in sorted(HERE.glob("*.yaml")):
        for where, message in problems(path):
            print("FAIL %s: %s" % (where, message))
            failed = True
        checked += 1
    for path in sorted((HERE / "schemas" / "invalid").glob("*.yaml")):
        found = problems(path)
        if not found:
            print("FAIL %s: accepted, but it must be refused" % path.relative_to(HERE.parent.parent))
            failed = True
        else:
            print("ok   %s refused: %s" % (path.name, found[0][1]))
    if failed:
        sys.exit(1)
    print("ok   the custom resources of %d manifest files match their schemas" % checked)


if __name__ == "__main__":
    main()
