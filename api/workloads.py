"""The workload filters (``?namespace=&pod=&container=&job=``): exact names, checked here so
a bad value is a 400 naming the rule it broke, never a 500 or a silent empty answer."""

from __future__ import annotations

import re

from hbmwatch.validation import InvalidQuery

_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
#: name -> (pattern, what it must be): Kubernetes' own rules for namespace, pod and
#: container names; a Slurm job id (``4242``, array ``4242_7``, het ``4242+1``) or the
#: ids a job-mapping file holds.
RULES: dict[str, tuple[re.Pattern[str], str]] = {
    "namespace": (re.compile(_DNS_LABEL), "a Kubernetes namespace (DNS label, <= 63 chars)"),
    "pod": (
        re.compile(rf"(?=.{{1,253}}$){_DNS_LABEL}(?:\.{_DNS_LABEL})*"),
        "a Kubernetes pod name (DNS subdomain, <= 253 chars)",
    ),
    "container": (re.compile(_DNS_LABEL), "a Kubernetes container name (DNS label)"),
    "job": (
        re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+:-]{0,63}"),
        "a job id (letters, digits, _ . + : -, <= 64 chars)",
    ),
}


def workload_filter(**values: str | None) -> dict[str, str]:
    """The given filters, checked; {} when none is given.

    >>> workload_filter(namespace="ml", pod=None, job="4242_1")
    {'namespace': 'ml', 'job': '4242_1'}
    >>> workload_filter(pod="Bad Pod")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    hbmwatch.validation.InvalidQuery: pod: 'Bad Pod' is not a Kubernetes pod name ...
    """
    out = {}
    for name, value in values.items():
        if value is None:
            continue
        pattern, what = RULES[name]
        if not pattern.fullmatch(value):
            raise InvalidQuery(f"{name}: {value[:300]!r} is not {what}", parameter=name)
        out[name] = value
    return out
