"""What the node and its pods use: collection (:mod:`nodeagent.stats.collector`, from CRI stats
and the host), and the kubelet's read APIs built from it (:mod:`nodeagent.stats.summary`:
/stats/summary and /metrics/resource)."""

from nodeagent.stats.collector import Usage, UsageCollector
from nodeagent.stats.summary import resource_metrics, summary, volume_stats_metrics

__all__ = ["Usage", "UsageCollector", "resource_metrics", "summary", "volume_stats_metrics"]
