"""A PromQL grammar over a dataset's metrics and labels, as hypothesis strategies.

It covers what issue 15 asks hbmwatch to evaluate: selectors with the four matchers and
``offset``; the counter and ``*_over_time`` functions; aggregations with ``by``/``without``;
arithmetic and comparisons (with ``bool``) between scalars and vectors and between vectors
with ``on``/``ignoring`` and ``group_left``/``group_right``; ``and``/``or``/``unless``;
``abs``, ``clamp*``, ``round``, ``absent``, ``label_replace``, ``time``, ``vector``,
``scalar``, ``histogram_quantile`` and subqueries.  Expressions are built to be valid
PromQL most of the time; the few that are not must be errors on both engines.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from tests.promdiff.dataset import Dataset

RANGES = ("30s", "1m", "90s", "2m", "5m", "10m")
OFFSETS = ("", "", "", " offset 1m", " offset 5m", " offset 7m30s", " offset -2m")
#: Offsets and ``@`` modifiers.  Prometheus 2.42 mishandles ``@`` under ``timestamp()``
#: (answers nothing) and ``predict_linear`` (a range query gets one step), and hbmwatch
#: refuses ``@`` on subqueries, so those take ``OFFSETS`` only.
AT_OFFSETS = (*OFFSETS, " @ 1799996400", " @ end()", " @ start() offset 1m")
QUANTILES = ("0", "0.25", "0.5", "0.9", "0.99", "1", "-0.5", "1.5")
NUMBERS = ("0", "1", "2", "0.5", "-3", "100", "1e9", "420")
ARITH = ("+", "-", "*", "/", "%", "^")
COMPARE = ("==", "!=", ">", "<", ">=", "<=")
REGEXES = (".*", ".+", "", "h[01]", "h0|h2", "r.*", "0|2", "MI.*", "(co|un).*", "c1")
AGGS = ("sum", "avg", "min", "max", "count", "stddev", "stdvar", "group")
OVER_TIME = (
    "avg_over_time",
    "min_over_time",
    "max_over_time",
    "sum_over_time",
    "count_over_time",
    "last_over_time",
    "stddev_over_time",
    "stdvar_over_time",
    "present_over_time",
)
COUNTER_FNS = ("rate", "irate", "increase", "resets", "changes")
GAUGE_FNS = ("delta", "deriv", "idelta", "changes", "resets")
#: Queries both engines must refuse (or, for a range selector asked at an instant, answer
#: with a matrix); promql-parser is not asked about these.
INVALID = (
    "rate(gpu_power_watts)",
    "sum(gpu_power_watts[5m])",
    'gpu_power_watts{host=~"("}',
    '{__name__=~".*"}',
    "gpu_power_watts[5m]",
    "gpu_power_watts + on(cluster) gpu_clock_hertz",
    "sum by (host) (gpu_power_watts) / gpu_power_watts",
    'label_replace(gpu_power_watts, "dst", "$1", "host", "(")',
    'label_replace(gpu_power_watts, "1dst", "$1", "host", "(.*)")',
    "quantile_over_time(0.5, gpu_power_watts)",
    "gpu_power_watts and 1",
    "topk(gpu_power_watts, 2)",
    'count_values("a b", gpu_throttle_active)',
    "absent(nope_metric) + vector(1)",
    '{host="h0"}',
    "sum(gpu_power_watts) by (host) / on(host) group_left(rack) gpu_power_watts",
)


@dataclass(frozen=True)
class Grammar:
    """The dataset's vocabulary, and strategies that compose queries from it."""

    ds: Dataset

    def labels(self, metric: str | None = None) -> list[str]:
        if metric is None:
            return sorted(set(self.ds.label_values) - {"uuid", "serial"})
        return (self.ds.gauges | self.ds.counters)[metric]

    def matcher(self, metric: str) -> st.SearchStrategy[str]:
        label = st.sampled_from([*self.labels(metric), "rack", "sku", "partition", "nope"])

        def build(name: str, op: str, real: bool, pick: int, regex: str) -> str:
            values = self.ds.label_values.get(name, ["x"])
            value = values[pick % len(values)] if real or op in ("=", "!=") else regex
            return f'{name}{op}"{value}"'

        return st.builds(
            build,
            label,
            st.sampled_from(("=", "!=", "=~", "!~")),
            st.booleans(),
            st.integers(0, 50),
            st.sampled_from(REGEXES),
        )

    def selector(self, metrics: list[str]) -> st.SearchStrategy[str]:
        @st.composite
        def build(draw: st.DrawFn) -> str:
            metric = draw(st.sampled_from(metrics))
            matchers = draw(st.lists(self.matcher(metric), max_size=2))
            if draw(st.integers(0, 9)) == 0:  # the metric name as a matcher
                return "{" + ",".join([f'__name__="{metric}"', *matchers]) + "}"
            return metric + ("{" + ",".join(matchers) + "}" if matchers else "")

        return build()

    def instant(self, metrics: list[str], *, at: bool = True) -> st.SearchStrategy[str]:
        offsets = st.sampled_from(AT_OFFSETS if at else OFFSETS)
        return st.builds(lambda s, o: s + o, self.selector(metrics), offsets)

    def ranged(self, metrics: list[str], *, at: bool = True) -> st.SearchStrategy[str]:
        return st.builds(
            lambda s, r, o: f"{s}[{r}]{o}",
            self.selector(metrics),
            st.sampled_from(RANGES),
            st.sampled_from(AT_OFFSETS if at else OFFSETS),
        )

    # -- leaves ---------------------------------------------------------------------------
    def continuous(self) -> st.SearchStrategy[str]:
        """Vectors without ties between series: safe under topk/bottomk and sort."""
        gauges, counters = list(self.ds.continuous), list(self.ds.counters)
        return st.one_of(
            self.instant(gauges),
            st.builds(lambda r: f"rate({r})", self.ranged(counters)),
            st.builds(lambda r: f"avg_over_time({r})", self.ranged(gauges)),
        )

    def leaf(self) -> st.SearchStrategy[str]:
        gauges, counters = list(self.ds.gauges), list(self.ds.counters)
        every = gauges + counters
        return st.one_of(
            self.instant(every),
            st.builds(
                lambda f, r: f"{f}({r})", st.sampled_from(COUNTER_FNS), self.ranged(counters)
            ),
            st.builds(lambda f, r: f"{f}({r})", st.sampled_from(GAUGE_FNS), self.ranged(gauges)),
            st.builds(lambda f, r: f"{f}({r})", st.sampled_from(OVER_TIME), self.ranged(every)),
            st.builds(
                lambda q, r: f"quantile_over_time({q}, {r})",
                st.sampled_from(QUANTILES),
                self.ranged(gauges),
            ),
            self.subquery(),
            self.more(),
            st.builds(lambda s: f"absent({s})", self.instant(every)),
            st.builds(lambda s: f"vector({s})", self.scalar_leaf()),
            st.builds(lambda s: f"timestamp({s})", self.instant(gauges, at=False)),
            st.builds(
                lambda q, r: f"histogram_quantile({q}, sum by (le) (rate({r})))",
                st.sampled_from(QUANTILES),
                self.ranged(counters),
            ),
        )

    def subquery(self) -> st.SearchStrategy[str]:
        gauges, counters = list(self.ds.gauges), list(self.ds.counters)
        inner = st.one_of(
            st.builds(lambda r: f"rate({r})", self.ranged(counters)),
            self.instant(gauges),
            st.builds(lambda s: f"sum({s})", self.instant(gauges)),
        )
        return st.builds(
            lambda f, e, r, s, o: f"{f}(({e})[{r}:{s}]{o})",
            st.sampled_from(("max_over_time", "avg_over_time", "min_over_time", "count_over_time")),
            inner,
            st.sampled_from(("5m", "10m", "20m")),
            st.sampled_from(("", "1m", "30s", "45s")),
            st.sampled_from(OFFSETS),
        )

    def more(self) -> st.SearchStrategy[str]:
        """Functions beyond issue 15's list that hbmwatch evaluates (docs/promql.md)."""
        gauges = list(self.ds.gauges)
        return st.one_of(
            st.builds(lambda r: f"predict_linear({r}, 600)", self.ranged(gauges, at=False)),
            st.builds(lambda r: f"holt_winters({r}, 0.5, 0.3)", self.ranged(gauges)),
            st.builds(lambda r: f"absent_over_time({r})", self.ranged(gauges)),
            st.builds(
                lambda f, s: f"{f}({s})",
                st.sampled_from(("sgn", "exp", "ln", "sqrt", "log2", "log10", "deg", "sin")),
                self.instant(gauges),
            ),
            st.builds(
                lambda s: f'label_join({s}, "dst", "-", "host", "gpu", "nope")',
                self.instant(gauges),
            ),
            st.builds(lambda s: f"hour(timestamp({s}))", self.instant(gauges, at=False)),
            st.builds(lambda a, b: f"{a} atan2 {b}", self.instant(gauges), self.instant(gauges)),
        )

    def scalar_leaf(self) -> st.SearchStrategy[str]:
        return st.one_of(
            st.sampled_from(NUMBERS),
            st.just("time()"),
            st.builds(lambda s: f"scalar(sum({s}))", self.instant(list(self.ds.gauges))),
            st.builds(lambda s: f"scalar({s})", self.instant(list(self.ds.gauges))),
        )

    # -- composition ----------------------------------------------------------------------
    def grouping(self, most: int = 3) -> st.SearchStrategy[str]:
        labels = st.lists(st.sampled_from(self.labels()), min_size=0, max_size=most, unique=True)
        return st.builds(
            lambda kw, ls: f" {kw} ({', '.join(ls)}) " if kw else " ",
            st.sampled_from(("", "by", "by", "without")),
            labels,
        )

    def extend(self, child: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        labels = self.labels()
        return st.one_of(
            st.builds(
                lambda a, g, c: f"{a}{g}({c})", st.sampled_from(AGGS), self.grouping(), child
            ),
            st.builds(
                lambda a, k, g, c: f"{a}{g}({k}, {c})",
                st.sampled_from(("topk", "bottomk")),
                st.sampled_from(("1", "2", "5")),
                self.grouping(),
                self.continuous(),
            ),
            st.builds(
                lambda q, g, c: f"quantile{g}({q}, {c})",
                st.sampled_from(QUANTILES),
                self.grouping(),
                child,
            ),
            st.builds(
                lambda g, n, c: f'count_values{g}("{n}", {c})',
                # Prometheus 2.42 appends the value label to the parsed `by` list in place:
                # with three labels (capacity four) a range query loses labels after its
                # first step.  Two labels at most keep clear of that bug.
                self.grouping(most=2),
                st.sampled_from(("value", "value", "host", "__name__")),
                child,
            ),
            st.builds(
                lambda f, c: f"{f}({c})", st.sampled_from(("abs", "round", "ceil", "floor")), child
            ),
            st.builds(lambda c, n: f"round({c}, {n})", child, st.sampled_from(("0.5", "10", "3"))),
            st.builds(
                lambda c, a, b: f"clamp({c}, {a}, {b})",
                child,
                st.sampled_from(NUMBERS),
                st.sampled_from(NUMBERS),
            ),
            st.builds(
                lambda f, c, n: f"{f}({c}, {n})",
                st.sampled_from(("clamp_min", "clamp_max")),
                child,
                st.sampled_from(NUMBERS),
            ),
            st.builds(
                lambda f, c: f"{f}({c})", st.sampled_from(("sort", "sort_desc")), self.continuous()
            ),
            st.builds(
                lambda c, dst, rep, src, rx: (
                    f'label_replace({c}, "{dst}", "{rep}", "{src}", "{rx}")'
                ),
                child,
                st.sampled_from(("dst", "dst", "host", "rack")),
                st.sampled_from(("$1", "$1", "", "x-$1-${1}")),
                st.sampled_from([*labels, "__name__"]),
                st.sampled_from(("(.*)", "h(.*)", "(r)[0-9]", "gpu_(.*)_total")),
            ),
            self.vector_scalar(child),
            self.vector_vector(child),
        )

    def vector_scalar(self, child: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        op = st.one_of(
            st.sampled_from(ARITH),
            st.builds(lambda c, b: c + b, st.sampled_from(COMPARE), st.sampled_from(("", " bool"))),
        )
        return st.builds(
            lambda c, o, s, left: f"{c} {o} {s}" if left else f"{s} {o} {c}",
            child,
            op,
            self.scalar_leaf(),
            st.booleans(),
        )

    def vector_vector(self, child: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        @st.composite
        def build(draw: st.DrawFn) -> str:
            on = draw(
                st.lists(
                    st.sampled_from(["host", "gpu", "rack", "cluster"]),
                    min_size=1,
                    max_size=2,
                    unique=True,
                )
            )
            left = draw(child)
            right = f"sum by ({', '.join(on)}) ({draw(child)})"
            style = draw(st.integers(0, 7))
            extra = draw(st.sampled_from(("", "", "(rack)", "(sku, partition)")))
            op = draw(
                st.one_of(
                    st.sampled_from(ARITH),
                    st.builds(
                        lambda c, b: c + b, st.sampled_from(COMPARE), st.sampled_from(("", " bool"))
                    ),
                )
            )
            keys = ", ".join(on)
            if style == 0:
                return f"{left} {op} on({keys}) group_left{extra} {right}"
            if style == 1:
                return f"{right} {op} on({keys}) group_right{extra} {left}"
            if style == 4:
                return f"{left} {op} on() group_left {draw(child)}"
            if style == 5:
                return f"{left} {op} ignoring(stack, domain, reason) group_left{extra} {right}"
            if style == 2:
                return f"sum by ({keys}) ({left}) {op} {right}"
            if style == 3:
                return f"{left} {op} ignoring(nope) {draw(child)}"
            setop = draw(st.sampled_from(("and", "or", "unless")))
            matching = draw(st.sampled_from(("", f" on({keys})", " ignoring(stack, domain)")))
            return f"{left} {setop}{matching} {draw(child)}"

        return build()

    def query(self) -> st.SearchStrategy[str]:
        vectors = st.recursive(self.leaf(), self.extend, max_leaves=3)
        scalars = st.builds(
            lambda a, o, b, p, c: f"{a} {o} {b} {p} {c}",
            self.scalar_leaf(),
            st.sampled_from(ARITH),
            self.scalar_leaf(),
            st.sampled_from((*ARITH, "==bool", ">bool")),
            st.one_of(self.scalar_leaf(), st.builds(lambda x: f"-{x}", self.scalar_leaf())),
        )
        vectors = st.one_of(
            vectors,
            vectors,
            vectors,
            vectors,
            st.builds(lambda v: f"-{v}", vectors),
            st.builds(
                lambda m, q: f"absent(nope_metric{{{m}}}) * {q}",
                st.sampled_from(('host="h0"', 'host="h0",rack=~"r.*"', 'a="1",a="2"')),
                st.sampled_from(("1", "2 ^ 3 ^ 2", "-2 ^ 2")),
            ),
        )
        return st.one_of(
            vectors, vectors, vectors, vectors, vectors, vectors, scalars, st.sampled_from(INVALID)
        )
