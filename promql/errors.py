"""How a query fails, in the categories of Prometheus' HTTP API.

``bad_data`` (400): the query or a parameter cannot be parsed.  ``execution`` (422): it
parsed but cannot be evaluated (many-to-many matching, duplicate label sets).
``unsupported`` (422): hbmwatch does not evaluate this construct; the message names it,
because a wrong answer would be worse than none.
"""

from __future__ import annotations


class QueryError(Exception):
    """A query that cannot be answered; ``error_type`` is Prometheus' ``errorType``."""

    error_type = "execution"
    status = 422


class BadQuery(QueryError):
    error_type = "bad_data"
    status = 400


class Unsupported(QueryError):
    error_type = "unsupported"
    status = 422

    def __init__(self, construct: str) -> None:
        super().__init__(f"{construct} is not supported by hbmwatch's PromQL engine")
        self.construct = construct
