"""``webhook.policy.load`` on broken policy text: every problem names its line and field.

A platform engineer reads these errors in CI or in the webhook's log with the file open
next to it; the line must be the one to edit and the path must be the field to fix.
Each case marks its expected line with a ``# <-`` comment.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from webhook.policy.load import MAX_POLICY_BYTES, PolicyError, load_file, load_text

HEAD = """\
apiVersion: gpu-webhook.dev/v1alpha1
kind: GPUPolicy
metadata:
  name: test-policy
"""

# One tenant with products; cases edit it or replace it.
GOOD = HEAD + """\
spec:
  products:
    aliases:
      a100: NVIDIA-A100-SXM4-80GB
      h100: NVIDIA-H100-80GB-HBM3
  tenants:
    - name: research
      namespaces: [research, research-dev]
      allowedProducts: [a100, h100]
      defaultProduct: a100
      quota:
        gpus: 8
"""


def _spec(body: str) -> str:
    return HEAD + "spec:\n" + textwrap.indent(textwrap.dedent(body), "  ")


def _tenant(body: str) -> str:
    """A policy with products a100/h100 and one tenant whose fields are ``body``."""
    return _spec("""\
        products:
          aliases:
            a100: NVIDIA-A100-SXM4-80GB
            h100: NVIDIA-H100-80GB-HBM3
        tenants:
          - name: research
        """) + textwrap.indent(textwrap.dedent(body), "      ")


def _training_run(body: str) -> str:
    """A policy with one workload kind, ml.example.com/v1 TrainingRun (resource
    trainingruns), whose further fields (roles, gang fields) are ``body``."""
    return _spec("""\
        workloadKinds:
          - group: ml.example.com
            kind: TrainingRun
            resource: trainingruns
            versions: [v1]
        """) + textwrap.indent(textwrap.dedent(body), "      ")


CASES: list[tuple[str, str, str, str]] = [
    # (id, policy text with "# <-" on the expected line, field path, message fragment)
    ("unknown-top-field", HEAD + "spec: {}\nstatus: {}  # <-\n", "status",
     "unknown field 'status'"),
    ("unknown-spec-field", _spec("tenant: []  # <-\n"), "spec.tenant",
     "unknown field 'tenant'"),
    ("unknown-tenant-field", _tenant("namespaces: [a]\nmaxGpus: 4  # <-\n"),
     "spec.tenants[0].maxGpus", "did you mean 'maxGpusPerPod'?"),
    ("unknown-quota-field", _tenant("namespaces: [a]\nquota:\n  gpu: 4  # <-\n"),
     "spec.tenants[0].quota.gpu", "unknown field 'gpu'"),
    ("wrong-type-number", _tenant("namespaces: [a]\nquota:\n  gpus: lots  # <-\n"),
     "spec.tenants[0].quota.gpus", "must be a number (got 'lots')"),
    ("wrong-type-list", _tenant("namespaces: research  # <-\n"),
     "spec.tenants[0].namespaces", "must be a list, e.g. [a, b]"),
    ("wrong-type-mapping", _spec("products: [a100]  # <-\n"), "spec.products",
     "must be a mapping of key: value lines (got a list)"),
    ("negative-count", _tenant("namespaces: [a]\nquota:\n  pods: -1  # <-\n"),
     "spec.tenants[0].quota.pods", "must be 0 or more (got -1)"),
    ("negative-max", _tenant("namespaces: [a]\nmaxGpusPerPod: -2  # <-\n"),
     "spec.tenants[0].maxGpusPerPod", "(got -2)"),
    ("zero-weight", _spec("gpuResources:\n  weights:\n    nvidia.com/mig-1g.10gb: 0  # <-\n"),
     "spec.gpuResources.weights.nvidia.com/mig-1g.10gb", "must be more than 0"),
    ("workload-replicas-other-item", _training_run("""\
            roles:
              - template: /spec/roles/*/template
                replicas: /spec/replicas  # <-
        """), "spec.workloadKinds[0].roles[0].replicas", "begin it with /spec/roles/*"),
    ("workload-built-in", _spec("""\
        workloadKinds:
          - group: batch.volcano.sh
            kind: Job  # <-
            resource: jobs
            versions: [v1alpha1]
            roles: [{template: /spec/tasks/*/template}]
        """), "spec.workloadKinds[0].kind", "is built in"),
    ("workload-bad-pointer", _training_run("""\
            roles:
              - template: spec.template  # <-
        """), "spec.workloadKinds[0].roles[0].template",
     "must be a JSON Pointer into the object, starting with / (e.g. /spec/template)"),
    ("workload-unknown-field", _training_run("""\
            gangMin: /spec/x  # <-
            roles: [{template: /spec/template}]
        """), "spec.workloadKinds[0].gangMin", "unknown field 'gangMin'"),
    ("wrong-api-version", "apiVersion: gpu-webhook.dev/v1  # <-\n" + HEAD.split("\n", 1)[1],
     "apiVersion", "must be 'gpu-webhook.dev/v1alpha1' (got 'gpu-webhook.dev/v1')"),
    ("wrong-kind", HEAD.replace("kind: GPUPolicy", "kind: GpuPolicy  # <-"), "kind",
     "'GPUPolicy'"),
    ("missing-metadata", "apiVersion: gpu-webhook.dev/v1alpha1  # <-\nkind: GPUPolicy\n",
     "metadata", "required field is missing"),
    ("missing-tenant-name", _spec("tenants:\n  - namespaces: [a]  # <-\n"),
     "spec.tenants[0].name", "required field is missing"),
    ("bad-name", HEAD.replace("name: test-policy", "name: Test_Policy  # <-"),
     "metadata.name", "must be a DNS label"),
    ("bad-namespace-name", _tenant("namespaces: [ok, Not_OK]  # <-\n"),
     "spec.tenants[0].namespaces[1]", "(got 'Not_OK')"),
    ("bad-mode", _spec("mode: enforced  # <-\n"), "spec.mode",
     "'enforce', 'warn' or 'audit' (got 'enforced')"),
    ("bad-tenant-mode", _tenant("namespaces: [a]\nmode: block  # <-\n"),
     "spec.tenants[0].mode", "(got 'block')"),
    ("unknown-rule", _spec("rules:\n  quotas: {mode: warn}  # <-\n"), "spec.rules.quotas",
     "unknown rule 'quotas'; the rules are: allowed-device-classes, allowed-products"),
    ("rule-without-mode", _spec("rules:\n  quota: {}  # <-\n"), "spec.rules.quota.mode",
     "required field is missing"),
    ("bad-toleration-operator",
     _spec("tolerations:\n  - key: nvidia.com/gpu\n    operator: Exist  # <-\n"),
     "spec.tolerations[0].operator", "(got 'Exist')"),
    ("toleration-exists-with-value",
     _spec("tolerations:\n  - key: gpu  # <-\n    operator: Exists\n    value: x\n"),
     "spec.tolerations[0]", "operator Exists takes no value"),
    ("toleration-seconds-without-noexecute",
     _spec("tolerations:\n  - key: gpu  # <-\n    operator: Exists\n    tolerationSeconds: 30\n"),
     "spec.tolerations[0]", "tolerationSeconds only applies to effect NoExecute"),
    ("bad-non-gpu-toleration-choice", _spec("nonGpuPodsToleratingGpuTaints: remove  # <-\n"),
     "spec.nonGpuPodsToleratingGpuTaints", "'strip', 'deny' or 'allow'"),
    ("bad-service-account", _spec("exemptions:\n  serviceAccounts: [device-plugin]  # <-\n"),
     "spec.exemptions.serviceAccounts[0]", "namespace/name"),
    ("duplicate-alias-value",
     _spec("products:\n  aliases:\n    a: NVIDIA-A100\n    b: NVIDIA-A100  # <-\n"),
     "spec.products.aliases.b", "aliases 'a' and 'b' both name 'NVIDIA-A100'"),
    ("undefined-allowed-product", _tenant("namespaces: [a]\nallowedProducts: [a100, t4]  # <-\n"),
     "spec.tenants[0].allowedProducts[1]", "product 't4' is not defined"),
    ("undefined-default-product", _tenant("namespaces: [a]\ndefaultProduct: t4  # <-\n"),
     "spec.tenants[0].defaultProduct", "add it under spec.products.aliases (defined: a100, h100)"),
    ("undefined-quota-product",
     _tenant("namespaces: [a]\ndefaultProduct: a100\nquota:\n  products:\n    t4: 2  # <-\n"),
     "spec.tenants[0].quota.products.t4", "product 't4' is not defined"),
    ("undefined-namespace-quota-product",
     _tenant("namespaces: [a]\ndefaultProduct: a100\nquota:\n  namespaces:\n"
             "    a:\n      products: {t4: 1}  # <-\n"),
     "spec.tenants[0].quota.namespaces.a.products.t4", "product 't4' is not defined"),
    ("default-product-not-allowed",
     _tenant("namespaces: [a]\nallowedProducts: [h100]\ndefaultProduct: a100  # <-\n"),
     "spec.tenants[0].defaultProduct", "defaultProduct 'a100' is not in allowedProducts"),
    ("per-product-quota-needs-default",
     _tenant("namespaces: [a]\nquota:\n  products: {a100: 4}  # <-\n"),
     "spec.tenants[0].quota.products", "set defaultProduct"),
    ("quota-for-foreign-namespace",
     _tenant("namespaces: [a]\nquota:\n  namespaces:\n    b: {gpus: 1}  # <-\n"),
     "spec.tenants[0].quota.namespaces.b", "which is not one of the tenant's namespaces"),
    ("namespace-in-two-tenants",
     _spec("tenants:\n  - name: a\n    namespaces: [shared]\n  - name: b\n"
           "    namespaces: [own, shared]  # <-\n"),
     "spec.tenants[1].namespaces[1]", "namespace 'shared' already belongs to tenant 'a'"),
    ("tenant-name-twice",
     _spec("tenants:\n  - name: a\n    namespaces: [x]\n  - name: a  # <-\n"
           "    namespaces: [y]\n"),
     "spec.tenants[1].name", "tenant name 'a' is used twice"),
    ("tenant-selects-nothing", _spec("tenants:\n  - name: lonely  # <-\n"),
     "spec.tenants[0]", "selects no namespace"),
    ("empty-namespace-selector",
     _tenant("namespaceSelector: {}  # <-\n"), "spec.tenants[0].namespaceSelector",
     "would match every namespace"),
    ("selector-in-without-values",
     _tenant("namespaceSelector:\n  matchExpressions:\n    - key: team  # <-\n"
             "      operator: In\n"),
     "spec.tenants[0].namespaceSelector.matchExpressions[0]", "needs at least one value"),
    ("topology-without-values",
     _tenant("namespaces: [a]\ntopology:\n  nodeLabel: rack\n  values: []  # <-\n"),
     "spec.tenants[0].topology.values", "at least 1 item"),
    ("bad-unassigned-choice", _spec("unassignedNamespaces: warn  # <-\n"),
     "spec.unassignedNamespaces", "(got 'warn')"),
]


def _expected_line(text: str) -> int:
    marked = [i for i, line in enumerate(text.splitlines(), 1) if "# <-" in line]
    assert len(marked) == 1, "each case marks exactly one line"
    return marked[0]


@pytest.mark.parametrize(("text", "path", "message"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_schema_error_names_line_and_field(text: str, path: str, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        load_text(text, "team.yaml")
    problems = caught.value.problems
    assert [p.path for p in problems] == [path], problems
    assert problems[0].line == _expected_line(text)
    assert message in problems[0].message
    # The rendered form is what `policy check` prints and the server logs.
    assert str(caught.value) == f"team.yaml:{problems[0].line}: {path}: {problems[0].message}"


def test_every_problem_is_reported_at_once() -> None:
    text = _tenant("namespaces: [a]\nmaxGpusPerPod: -1\nquota:\n  gpus: lots\n  pod: 3\n")
    with pytest.raises(PolicyError) as caught:
        load_text(text, "team.yaml")
    lines = str(caught.value).splitlines()
    assert lines == [
        "team.yaml:13: spec.tenants[0].maxGpusPerPod: must be 0 or more (got -1)",
        "team.yaml:15: spec.tenants[0].quota.gpus: must be a number (got 'lots')",
        "team.yaml:16: spec.tenants[0].quota.pod: unknown field 'pod': did you mean 'pods'?",
    ]


# Whole-file problems: no field path, a line when YAML knows one.
FILE_CASES: list[tuple[str, str, int | None, str]] = [
    ("syntax-error", GOOD.replace("  tenants:\n", "  tenants: [\n"), 11, "YAML syntax:"),
    ("bad-indentation", HEAD + "spec:\n  mode: warn\n   tenants: []\n", 7, "YAML syntax:"),
    ("tab-indentation", HEAD + "spec:\n\tmode: warn\n", 6, "YAML syntax:"),
    ("alias", HEAD + "spec:\n  tenants:\n    - &t {name: a, namespaces: [a]}\n    - *t\n",
     8, "YAML aliases (*name) are not allowed"),
    ("alias-in-value", HEAD.replace("  name: test-policy", "  name: &n test-policy")
     + "spec:\n  tenants:\n    - name: *n\n      namespaces: [a]\n", 7, "aliases"),
    # The line where the second policy starts, just below the ---.
    ("two-documents", GOOD + "---\n" + GOOD, GOOD.count("\n") + 2, "one policy per file"),
    ("not-a-mapping", "- apiVersion: gpu-webhook.dev/v1alpha1\n", 1, "expected a mapping"),
    ("scalar", "hello\n", 1, "expected a mapping"),
    ("empty", "", None, "the file is empty; expected a GPUPolicy document"),
    ("only-comments", "# nothing yet\n\n", None, "the file is empty"),
    ("empty-document-marker", "---\n", None, "the file is empty"),
    ("empty-document-end", "--- \n...\n", None, "the file is empty"),
]


@pytest.mark.parametrize(("text", "line", "message"), [c[1:] for c in FILE_CASES],
                         ids=[c[0] for c in FILE_CASES])
def test_file_level_error_names_the_line(text: str, line: int | None, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        load_text(text, "team.yaml")
    [problem] = caught.value.problems
    assert problem.path == ""
    assert problem.line == line
    assert message in problem.message
    where = f"team.yaml:{line}" if line else "team.yaml"
    assert str(caught.value).startswith(f"{where}: ")


@pytest.mark.parametrize("text", [GOOD, "---\n" + GOOD, GOOD + "---\n", GOOD + "...\n",
                                  "# policy\n---\n" + GOOD + "---\n# end\n"],
                         ids=["plain", "leading-marker", "trailing-marker", "end-marker",
                              "comments-and-markers"])
def test_good_policy_loads(text: str) -> None:
    policy = load_text(text)
    assert policy.metadata.name == "test-policy"
    assert policy.spec.tenants[0].default_product == "a100"


@pytest.mark.parametrize(("content", "message"), [
    (b"apiVersion: x\nmetadata: {name: caf\xe9}\n", "not UTF-8 text"),
    (b"#" * (MAX_POLICY_BYTES + 1), f"larger than {MAX_POLICY_BYTES} bytes"),
    (None, "cannot read the file: No such file or directory"),
], ids=["latin-1", "too-large", "missing"])
def test_unreadable_file_names_the_file(tmp_path: Path, content: bytes | None,
                                        message: str) -> None:
    path = tmp_path / "policy.yaml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(PolicyError) as caught:
        load_file(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert message in str(caught.value)


def test_directory_is_not_a_policy(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read the file"):
        load_file(tmp_path)


def test_anchor_bombs_are_refused_quickly() -> None:
    # "Billion laughs": without the alias ban this would expand to 10^9 list items.
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    with pytest.raises(PolicyError, match="aliases"):
        load_text(bomb)


def test_a_key_given_twice_names_both_lines() -> None:
    # The case: a tenant's ``mode: warn`` dedented to the spec level, where a
    # ``mode`` already is. YAML alone would keep the last one and warn for every tenant.
    text = _spec("mode: enforce\ntenants:\n  - name: research\n    namespaces: [a]\n"
                 "mode: warn  # <-\n")
    with pytest.raises(PolicyError) as caught:
        load_text(text, "team.yaml")
    assert str(caught.value) == (
        f"team.yaml:{_expected_line(text)}: spec.mode: duplicate key 'mode' (first at line 6): "
        "YAML keeps only the last one; remove one, or indent it under the mapping it "
        "belongs to")


def test_duplicate_keys_inside_lists_are_found_too() -> None:
    text = _tenant("namespaces: [a]\nquota:\n  gpus: 4\n  gpus: 40  # <-\n")
    with pytest.raises(PolicyError) as caught:
        load_text(text, "team.yaml")
    [problem] = caught.value.problems
    assert (problem.path, problem.line) == ("spec.tenants[0].quota.gpus", _expected_line(text))
    assert f"first at line {_expected_line(text) - 1}" in problem.message


def test_a_key_differing_only_in_case_gets_the_right_spelling() -> None:
    text = _spec("quotaLedger:\n  reservationTtlSeconds: 30  # <-\n")
    with pytest.raises(PolicyError) as caught:
        load_text(text, "team.yaml")
    [problem] = caught.value.problems
    assert problem.line == _expected_line(text)
    assert problem.message == ("unknown field 'reservationTtlSeconds': "
                               "did you mean 'reservationTTLSeconds'?")


# Nothing of the parsers' own wording reaches the platform engineer.
PARSER_WORDS = ("Input should be", "valid dictionary", "<block end>", "<block mapping start>",
                "expected ',' or", "should match pattern", "apiVersion: apiVersion")


def test_no_message_speaks_the_parsers_language() -> None:
    for _, text, _, _ in CASES:
        with pytest.raises(PolicyError) as caught:
            load_text(text, "team.yaml")
        for word in PARSER_WORDS:
            assert word not in str(caught.value), (word, str(caught.value))


def test_the_api_version_is_named_once() -> None:
    with pytest.raises(PolicyError) as caught:
        load_text("apiVersion: gpu-webhook.dev/v1\n" + HEAD.split("\n", 1)[1], "team.yaml")
    assert str(caught.value) == ("team.yaml:1: apiVersion: must be "
                                 "'gpu-webhook.dev/v1alpha1' (got 'gpu-webhook.dev/v1')")


@pytest.mark.parametrize(("key", "camel", "where"), [
    ("max_gpus_per_pod", "maxGpusPerPod", "spec.tenants[0]"),
    ("default_product", "defaultProduct", "spec.tenants[0]"),
    ("non_gpu_pods_tolerating_gpu_taints", "nonGpuPodsToleratingGpuTaints", "spec"),
], ids=["tenant", "tenant-product", "spec"])
def test_a_snake_case_key_is_refused_with_its_camel_case_name(key: str, camel: str,
                                                              where: str) -> None:
    # The docs write camelCase; the Python names were accepted too, so two spellings of
    # one field could meet in one file and one of them silently win.
    text = (_tenant(f"namespaces: [a]\n{key}: a100  # <-\n") if where != "spec" else
            _spec(f"{key}: strip  # <-\n"))
    with pytest.raises(PolicyError) as caught:
        load_text(text, "team.yaml")
    [problem] = caught.value.problems
    assert (problem.path, problem.line) == (f"{where}.{key}", _expected_line(text))
    assert problem.message == (f"unknown field {key!r}: policy fields are camelCase, as in "
                               f"policies/README.md: write {camel!r}")


@pytest.mark.parametrize(("text", "key", "meant"), [
    (_tenant("namespaces: [a]\nallowedProduct: [a100]  # <-\n"), "allowedProduct",
     "allowedProducts"),
    (_tenant("namespaces: [a]\nquota:\n  gpsu: 4  # <-\n"), "gpsu", "gpus"),
    (_spec("tenats: []  # <-\n"), "tenats", "tenants"),
], ids=["plural", "transposed", "spec-level"])
def test_an_unknown_key_is_told_the_closest_field_of_its_own_mapping(
        text: str, key: str, meant: str) -> None:
    with pytest.raises(PolicyError) as caught:
        load_text(text, "team.yaml")
    [problem] = caught.value.problems
    assert problem.line == _expected_line(text)
    assert problem.message == f"unknown field {key!r}: did you mean {meant!r}?"


# YAML syntax errors: what is wrong with the line, in words, and the line's own text.
SYNTAX_CASES: list[tuple[str, str, str]] = [
    ("dedented-key", HEAD + "spec:\n    mode: warn\n  tenants: []  # <-\n",
     'YAML syntax: this line is indented differently from the lines before it: the keys '
     'of one mapping, and the items of one list, must start in the same column. Line it '
     'up with the key it sits beside, or indent it under the one it belongs to (column 3 '
     'of "  tenants: []  # <-")'),
    ("indented-key", HEAD + "spec:\n  mode: warn\n   tenants: []  # <-\n",
     "YAML syntax: a ':' where no key can start: the line is indented deeper than the key "
     "before it (line it up), or a value holds ': ' (quote the value)"),
    ("tab", HEAD + "spec:\n\tmode: warn  # <-\n",
     "YAML syntax: a tab indents this line; YAML indents with spaces only: use spaces"),
    ("unclosed-list", HEAD + "spec:\n  tenants: [a,  # <-\n  mode: warn\n",
     "YAML syntax: a list opened with '[' at line 6 is not closed: add the ']'"),
    ("unclosed-at-the-end", HEAD + "spec:\n  tenants: [  # <-\n", "YAML syntax: a list or "
     "mapping opened with '[' or '{' is not closed before the end of the file"),
    ("unclosed-quote", HEAD + "spec:\n  mode: 'warn  # <-\n", "YAML syntax: a quoted "
     "string opened at line 6 is never closed: add the closing quote"),
]


@pytest.mark.parametrize(("text", "message"), [c[1:] for c in SYNTAX_CASES],
                         ids=[c[0] for c in SYNTAX_CASES])
def test_a_yaml_syntax_error_says_what_is_wrong_in_words(text: str, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        load_text(text, "team.yaml")
    [problem] = caught.value.problems
    assert message in problem.message
    for word in PARSER_WORDS:
        assert word not in problem.message
    # The line named is the one to edit (an unclosed bracket or quote: where the file
    # ends, with the line it opened on in the words).
    if "opened" not in message:
        assert problem.line == _expected_line(text)
