"""django-prometheus's request metrics, with the method label bounded.

django-prometheus 2.5.0 labels ``django_http_requests_latency_seconds_by_view_method`` with the
raw ``request.method`` (its own ``_method`` maps the rest to ``<invalid method>`` everywhere
else): daphne passes any token through, so every made-up method a client sent minted a histogram
of its own, kept for the life of the process, on every path Django serves (``/health``, 404s,
401s included)."""

from __future__ import annotations

from typing import Any

from django_prometheus import middleware


class PrometheusAfterMiddleware(middleware.PrometheusAfterMiddleware):  # type: ignore[misc]
    def label_metric(self, metric: Any, request: Any, response: Any = None, **labels: Any) -> Any:
        if "method" in labels:
            labels["method"] = self._method(request)
        return super().label_metric(metric, request, response, **labels)
