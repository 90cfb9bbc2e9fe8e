#!/usr/bin/env python3
"""Writes a cases file of N cases for `hopper plugin test`: the [route] table
of CASES (a project's cases.toml from `hopper plugin new`), then its first
four kinds of case over and over: ok, a tombstone, a canned 200 with an emit,
a canned 503. Usage: gen-cases.py N CASES > OUT (BENCHMARKS.md)."""
import sys
n = int(sys.argv[1])
head = open(sys.argv[2]).read().split("[[case]]")[0]
out = [head]
kinds = [
 ('payload = "hello"\n', '[case.expect]\nverdict = "ok"\nemit = []\nrequests = []\n'),
 ('tombstone = true\n', '[case.expect]\nverdict = "fatal"\nreason = "tombstone"\n'),
 ('key = "k"\npayload = "hello"\nconfig = { lookup-url = "https://api.example.com/status", out-topic = "orders.enriched" }\n[[case.http]]\nurl = "https://api.example.com/status"\nstatus = 200\n',
  '[case.expect]\nverdict = "ok"\nrequests = ["GET https://api.example.com/status"]\n[[case.expect.emit]]\ntopic = "orders.enriched"\nheaders = { lookup-status = "200" }\n'),
 ('payload = "hello"\nconfig = { lookup-url = "https://api.example.com/status" }\n[[case.http]]\nurl = "https://api.example.com/status"\nstatus = 503\n',
  '[case.expect]\nverdict = "retryable"\nreason_class = "RETRYABLE"\n'),
]
for i in range(n):
    msg, exp = kinds[i % 4]
    out.append(f'[[case]]\nname = "case {i}"\n{msg}{exp}\n')
sys.stdout.write("".join(out))
