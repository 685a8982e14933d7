#!/usr/bin/python3
"""check_schemas.py — the JSON Schemas in docs/schema/ agree with the files the programs accept:
every schema is a valid draft 2020-12 schema, and every shipped profile and plan validates
against the schema of its format (references between schemas resolved locally)."""
import glob
import json
import os
import sys

import jsonschema

root = os.environ.get("FF_SOURCE_ROOT", ".")
schemas = {}
for path in sorted(glob.glob(os.path.join(root, "docs/schema/*.schema.json"))):
    with open(path, encoding="utf-8") as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    schemas[schema["$id"]] = schema

by_format = {}
for schema_id, schema in schemas.items():
    name = schema_id.rsplit("/", 1)[1].replace(".schema.json", "")  # ff-plan-1
    by_format[name.rsplit("-", 1)[0] + "/" + name.rsplit("-", 1)[1]] = schema

failures = 0
files = sorted(glob.glob(os.path.join(root, "profiles/*/*.json")) +
               glob.glob(os.path.join(root, "tests/data/planner/*.json")))
for path in files:
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    schema = by_format[doc["format"]]
    resolver = jsonschema.RefResolver(base_uri=schema["$id"], referrer=schema, store=schemas)
    validator = jsonschema.Draft202012Validator(schema, resolver=resolver)
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
    for e in errors[:5]:
        print(f"{path}: {'/'.join(map(str, e.path))}: {e.message[:200]}")
    failures += bool(errors)

print(f"schemas: {len(schemas)} schemas, {len(files)} files, {failures} failing")
sys.exit(1 if failures or len(schemas) != 5 else 0)
