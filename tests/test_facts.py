"""Declared per-pod facts (issue 14 §2): the registry refuses a profile where a required fact has
no provider, a stage touches only the facts it declared, and the graph can be printed."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from nodeagent.errors import PluginError
from nodeagent.facts import Fact, PodFacts, UndeclaredFact, graph, render
from nodeagent.registry import resolve
from nodeagent.stages import Prepare, Result

SANDBOX = Fact[str]("test.sandbox", "the sandbox id")
EXTRA = Fact[int]("test.extra", "something optional")


class Producer(Prepare):
    name: ClassVar[str] = "producer"
    provides = (SANDBOX,)

    async def prepare(self, ctx: Any) -> Result:
        return Result.ok()

    async def unprepare(self, ctx: Any) -> None:
        return None


class Consumer(Producer):
    name: ClassVar[str] = "consumer"
    provides = ()
    requires = (SANDBOX,)
    uses = (EXTRA,)


def test_a_required_fact_without_a_provider_is_a_load_error() -> None:
    with pytest.raises(PluginError, match="stage.s. consumer require fact 'test.sandbox', which no stage"):
        resolve({"prepare": ["consumer"]}, {"consumer": Consumer()})
    pipeline = resolve({"prepare": ["producer", "consumer"]}, {"producer": Producer(), "consumer": Consumer()})
    assert set(pipeline.stages) == {"producer", "consumer"}, "an optional fact (uses) needs no provider"


def test_a_stage_touches_only_what_it_declared() -> None:
    facts = PodFacts()
    producer = facts.access("producer", Producer.provides, ())
    consumer = facts.access("consumer", Consumer.provides, (*Consumer.requires, *Consumer.uses))
    producer.set(SANDBOX, "abc")
    assert consumer.get(SANDBOX) == "abc" and consumer.get(EXTRA) is None
    with pytest.raises(UndeclaredFact, match="writes fact 'test.sandbox' without declaring it"):
        consumer.set(SANDBOX, "other")
    with pytest.raises(UndeclaredFact, match="reads fact 'test.extra' without declaring it"):
        producer.get(EXTRA)
    producer.clear(SANDBOX)
    assert consumer.get(SANDBOX) is None


def test_the_graph_names_providers_requirers_and_users() -> None:
    stages = {"producer": Producer(), "consumer": Consumer()}
    edges = {e.fact.name: (e.providers, e.requirers, e.users) for e in graph(stages)}
    assert edges == {"test.sandbox": (("producer",), ("consumer",), ()), "test.extra": ((), (), ("consumer",))}
    text = render(stages)
    assert "test.sandbox" in text and "producer" in text and "(consumer)" in text
