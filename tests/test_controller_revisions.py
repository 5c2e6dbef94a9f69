"""Revisions kept for rollbacks: their configs are read once, and an unreadable one is left out
rather than guessed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from kubernetes.client.exceptions import ApiException

from conftest import specmodel_doc
from specfleet.api import SpecModel, parse_specmodel
from specfleet.api.status import RevisionRecord
from specfleet.controller.kube import Kube
from specfleet.controller.revisions import RevisionConfigs
from specfleet.render import revision_hash
from specfleet.render.revision import controller_revision


def specmodel(k: int) -> SpecModel:
    speculative = {"method": "ngram", "numSpeculativeTokens": k}
    return parse_specmodel(specmodel_doc(speculative=speculative))


def record(model: SpecModel, number: int, verdict: str = "good") -> RevisionRecord:
    return RevisionRecord(number=number, hash=revision_hash(model.engine_config()), verdict=verdict)


@dataclass
class StoredRevisions:
    """The API server's ControllerRevisions, counting reads."""

    stored: dict[str, dict[str, Any]]
    reads: list[str] = field(default_factory=list)

    def read_revision(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads.append(name)
        if name not in self.stored:
            raise ApiException(status=404, reason="Not Found")
        return self.stored[name]


def test_a_good_revisions_config_is_read_once_and_the_specs_own_never() -> None:
    old, new = specmodel(3), specmodel(5)
    kept = controller_revision(old, record(old, 1))
    kube = StoredRevisions({kept["metadata"]["name"]: kept["data"]})
    configs = RevisionConfigs(cast(Kube, kube))
    history = [record(old, 1), record(new, 2, "probation")]
    first, second = configs.of(new, history), configs.of(new, history)
    assert first == second
    assert first[record(old, 1).hash] == old.engine_config()
    assert first[record(new, 2).hash] == new.engine_config()
    assert kube.reads == [kept["metadata"]["name"]]


def test_an_unreadable_revision_is_left_out_and_tried_again() -> None:
    old, new = specmodel(3), specmodel(5)
    kube = StoredRevisions({})
    configs = RevisionConfigs(cast(Kube, kube))
    history = [record(old, 1), record(new, 2)]
    assert set(configs.of(new, history)) == {record(new, 2).hash}
    configs.of(new, history)
    assert len(kube.reads) == 2  # a failed read is not remembered


def test_a_revision_that_served_clean_on_probation_is_read_as_a_rollback_target() -> None:
    clean, broken, never = specmodel(3), specmodel(5), specmodel(7)
    kept = {
        controller_revision(m, record(m, n))["metadata"]["name"]: m.engine_config().canonical()
        for n, m in ((1, clean), (2, never))
    }
    kube = StoredRevisions(kept)
    served = record(clean, 1, "probation").model_copy(update={"served_clean": True})
    history = [served, record(never, 2, "probation"), record(broken, 3, "probation")]
    configs = RevisionConfigs(cast(Kube, kube)).of(broken, history)
    assert configs[served.hash] == clean.engine_config()
    assert record(never, 2).hash not in configs  # no good evidence: never served, never read


def test_the_revision_the_fleet_serves_is_read_as_a_rollouts_control() -> None:
    control, new = specmodel(3), specmodel(5)
    kept = controller_revision(control, record(control, 1))
    kube = StoredRevisions({kept["metadata"]["name"]: kept["data"]})
    history = [record(control, 1, "probation"), record(new, 2, "probation")]
    assert record(control, 1).hash not in RevisionConfigs(cast(Kube, kube)).of(new, history)
    configs = RevisionConfigs(cast(Kube, kube)).of(new, history, serving=1)
    assert configs[record(control, 1).hash] == control.engine_config()
