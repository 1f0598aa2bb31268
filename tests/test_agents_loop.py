"""The agent loop with a scripted engine and retriever: probes, utilities, limits, failures, controllers."""

import asyncio

from raypipe.agents import AgentLoop, R1Searcher, SearchR1
from raypipe.core.config import AgentConfig
from raypipe.core.schema import conform
from raypipe.data.loaders import Question
from raypipe.llm.base import EngineError, EngineUnavailableError
from raypipe.testing.fakes import FakeEngine, FakeRetriever, ScriptedController, agent_turns

Q = Question(qid="q1", dataset="toy", question="Who wrote Hamlet", golden_answers=["William Shakespeare"])
SEARCH_1 = "<think> I need the author. </think>\n<search> Hamlet author </search>"
SEARCH_2 = "<think> Check again. </think>\n<search> Shakespeare </search>"
ANSWER = "<think> Found it. </think>\n<answer> William Shakespeare </answer>"


def probe_by_evidence(prompt: str) -> str:
    """Probe answers improve with what the context holds: nothing, one search, two searches."""
    if "passage 0 about Shakespeare" in prompt:
        return " William Shakespeare </answer>"
    if "passage 0 about Hamlet author" in prompt:
        return " Shakespeare </answer>"
    return " Marlowe </answer>"


def run(
    turns, agent=None, protocol=None, retriever=None, controller=None, probe=probe_by_evidence, engine=None, top_k=3
):
    engine = engine or FakeEngine(agent_turns(turns, probe))
    loop = AgentLoop(
        engine,
        retriever or FakeRetriever(n=5),
        protocol or SearchR1("pyterrier"),
        agent or AgentConfig(max_turns=4),
        top_k=top_k,
        deep_k=5,
        controller=controller,
    )
    return asyncio.run(loop.run(Q)), engine


def test_probe_at_every_iteration_including_zero_with_p_and_u():
    out, engine = run([SEARCH_1, SEARCH_2, ANSWER])
    rows, traj = out.iterations, out.trajectory
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    assert rows[0]["query"] is None and rows[0]["doc_ids"] is None and rows[0]["doc_scores"] is None
    assert rows[1]["query"] == "Hamlet author" and rows[2]["query"] == "Shakespeare"
    assert rows[1]["doc_ids"] == [f"Hamlet author-{i}" for i in range(5)]  # the deep list, not only the top 3
    assert [r["probe_answer"] for r in rows] == ["Marlowe", "Shakespeare", "William Shakespeare"]
    assert [round(r["probe_f1"], 3) for r in rows] == [0.0, 0.667, 1.0]
    assert rows[0]["utility"] is None
    assert [round(r["utility"], 3) for r in rows[1:]] == [0.667, 0.333]
    assert all(r["probe_token_logprobs"] == [-0.5] * r["probe_tokens"] for r in rows)
    assert rows[2]["reasoning"] == ANSWER
    assert traj["stop_reason"] == "answer" and traj["final_answer"] == "William Shakespeare"
    assert traj["final_f1"] == 1.0 and traj["n_iterations"] == 2 and traj["error"] is None
    assert traj["tokens_generated"] == sum(r["tokens_generated"] for r in rows) > 0
    conform(rows, "iterations")
    conform([traj], "trajectories")


def test_contexts_and_probes_share_the_trajectory_prefix():
    out, engine = run([SEARCH_1, SEARCH_2, ANSWER])
    agent = [r for r in engine.requests if not r.prompt.endswith("<answer>")]
    probes = [r for r in engine.requests if r.prompt.endswith("<answer>")]
    assert len(agent) == 3 and len(probes) == 3
    for turn, probe in zip(agent, probes):
        assert probe.prompt.startswith(turn.prompt)  # a probe only extends the context it follows
        assert probe.temperature == 0.0 and probe.stop == ("</answer>",) and probe.logprobs
    for before, after in zip(agent, agent[1:]):
        assert after.prompt.startswith(before.prompt)
    prompt = agent[0].prompt
    assert agent[1].prompt == (
        prompt + "\n\n" + SEARCH_1 + '\n\n<information>Doc 1(Title: "Title 0") passage 0 about Hamlet author\n'
        'Doc 2(Title: "Title 1") passage 1 about Hamlet author\nDoc 3(Title: "Title 2") passage 2 about Hamlet author'
        "</information>\n\n"
    )
    assert probes[1].prompt == agent[1].prompt + "\n\n<think> Check again. </think>\n\n<answer>"
    assert out.trajectory["transcript"] == agent[2].prompt[len(prompt) :] + "\n\n" + ANSWER


def test_turn_limit_gives_no_answer_and_reads_no_documents_after_the_last_search():
    """pyterrier-rag 0.3.0 ``frameworks/agentic/_base.py`` ``transform`` (lines 98-188): the turn loop ends
    after the last turn's search with "No answer after max turns" and ``qanswer`` empty; the seed's
    ``probing/agents.py`` ``_BatchedAnswerProbingMixin.transform`` probes once per generation, so no
    probe reads the last search's documents."""
    out, engine = run([SEARCH_1, SEARCH_2], AgentConfig(max_turns=2))
    rows, traj = out.iterations, out.trajectory
    assert [r["iteration"] for r in rows] == [0, 1]  # no row for documents no turn read
    assert traj["stop_reason"] == "max_turns" and traj["final_answer"] is None and traj["final_f1"] == 0.0
    assert traj["n_iterations"] == 2  # both searches ran, as pyterrier-rag's search_iterations counts them
    assert len(engine.requests) == 4  # two turns and their probes, nothing after the last search
    assert traj["transcript"].endswith("passage 2 about Shakespeare</information>\n\n")


def test_turn_limit_forced_answer_is_an_option():
    out, engine = run([SEARCH_1, SEARCH_2], AgentConfig(max_turns=2, at_limit="forced"))
    rows, traj = out.iterations, out.trajectory
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    assert rows[2]["query"] == "Shakespeare" and rows[2]["reasoning"] == "" and rows[2]["tokens_generated"] == 0
    assert rows[2]["probe_answer"] == "William Shakespeare"
    assert traj["stop_reason"] == "max_turns" and traj["final_answer"] == "William Shakespeare"
    assert traj["n_iterations"] == 2
    assert traj["transcript"].endswith("</information>\n\n\n\n<answer> William Shakespeare </answer>")


def test_a_search_without_results_ends_a_pyterrier_trajectory():
    """pyterrier-rag 0.3.0 ``frameworks/agentic/_base.py`` (lines 163-176): a query with no documents gets
    "No retrieval results" and leaves the active set before the model is called again (both agents)."""
    r1_search = " I need the author. <|begin_of_query|> Hamlet author <|end_of_query|>"
    for protocol, turn in ((SearchR1("pyterrier"), SEARCH_1), (R1Searcher("pyterrier"), r1_search)):
        out, engine = run([turn, ANSWER], protocol=protocol, retriever=FakeRetriever(n=0))
        traj = out.trajectory
        assert traj["stop_reason"] == "no_results" and "no retrieval results" in traj["error"]
        assert traj["final_answer"] is None and [r["iteration"] for r in out.iterations] == [0]
        assert len(engine.requests) == 2 and traj["n_iterations"] == 1  # turn 0 and its probe
        conform([traj], "trajectories")
    out, _ = run([SEARCH_1, ANSWER], protocol=SearchR1("original"), retriever=FakeRetriever(n=0))
    assert out.trajectory["stop_reason"] == "answer"  # Search-R1's own loop reads an empty <information>


def test_search_r1_original_ends_with_a_final_rollout_without_search():
    """Search-R1 ``search_r1/llm_agent/generation.py`` ``run_llm_loop`` (lines 220-319): ``max_turns`` turns,
    then one "final LLM rollout" (line 278) with ``do_search=False``: its answer counts, its search is not run."""
    out, engine = run([SEARCH_1, ANSWER], AgentConfig(max_turns=1), protocol=SearchR1("original"))
    assert out.trajectory["stop_reason"] == "answer" and out.trajectory["final_answer"] == "William Shakespeare"
    assert [r["iteration"] for r in out.iterations] == [0, 1]
    retriever = FakeRetriever(n=5)
    out, _ = run([SEARCH_1, SEARCH_2], AgentConfig(max_turns=1), protocol=SearchR1("original"), retriever=retriever)
    assert out.trajectory["stop_reason"] == "max_turns" and out.trajectory["final_answer"] is None
    assert [q for queries, _ in retriever.calls for q in queries] == ["Hamlet author"]  # the rollout's search: not run


def test_r1_searcher_original_uses_one_generation_less_than_its_limit():
    """R1-Searcher ``evaluation/eval_search_loacl.py`` (lines 179-213): at round ``k == 9`` of the loop the
    generated text is discarded and the answer is "I don't know.": of 10 rounds, 9 are usable."""
    search = " look <|begin_of_query|> Hamlet author <|end_of_query|>"
    agent = AgentConfig(max_turns=3)
    out, engine = run([search, search], agent, protocol=R1Searcher("original"), top_k=5)
    agent_requests = [r for r in engine.requests if not r.prompt.endswith("<answer>")]
    assert len(agent_requests) == 2 and out.trajectory["stop_reason"] == "max_turns"
    assert out.trajectory["final_answer"] is None and out.iterations[1]["query"] == " Hamlet author "
    original = AgentConfig(protocol="r1_searcher", observation_format="original")  # its default limit: 10
    assert R1Searcher("original").turn_plan(original) == (9, 9)
    pyterrier = (
        R1Searcher("pyterrier").turn_plan(AgentConfig(protocol="r1_searcher")),
        SearchR1("pyterrier").turn_plan(AgentConfig()),
    )
    assert pyterrier == ((10, 10), (10, 10))
    assert SearchR1("original").turn_plan(AgentConfig(observation_format="original")) == (5, 4)  # its limit: 4


def test_invalid_action_stops_pyterrier_and_is_corrected_in_search_r1_original():
    out, _ = run(["<think> hmm </think> I am not sure"])
    assert out.trajectory["stop_reason"] == "no_valid_action" and "neither" in out.trajectory["error"]
    assert len(out.iterations) == 1 and out.iterations[0]["probe_answer"] == "Marlowe"  # the probe still ran

    out, engine = run(["<think> hmm </think>", SEARCH_1, ANSWER], protocol=SearchR1("original"))
    assert out.trajectory["stop_reason"] == "answer"
    agent = [r for r in engine.requests if not r.prompt.endswith("<answer>")]
    assert agent[1].prompt.endswith(
        "<think> hmm </think>\nMy previous action is invalid. If I want to search, I should "
        "put the query between <search> and </search>. If I want to give the final answer, I should put the answer "
        "between <answer> and </answer>. Let me try again.\n"
    )
    assert out.iterations[1]["query"] is None  # no retrieval before turn 1
    assert out.iterations[2]["query"] == "Hamlet author" and out.trajectory["n_iterations"] == 1


def test_an_engine_outage_is_engine_error_and_a_refused_request_internal_error():
    """An engine that cannot answer is an outage (engine_error: a rerun retries it); a request it refuses
    would be refused again (internal_error: a rerun keeps it)."""
    out, _ = run([SEARCH_1, EngineUnavailableError("http://x/v1 failed after 3 attempts: HTTP 503")])
    traj = out.trajectory
    assert traj["stop_reason"] == "engine_error" and traj["error"] == "http://x/v1 failed after 3 attempts: HTTP 503"
    assert traj["final_answer"] is None and traj["final_f1"] == 0.0
    assert [r["iteration"] for r in out.iterations] == [0]
    conform([traj], "trajectories")
    out, _ = run([SEARCH_1, EngineError("HTTP 400 from http://x/v1: bad request")])
    assert out.trajectory["stop_reason"] == "internal_error" and out.trajectory["error"].startswith("HTTP 400")
    assert [r["iteration"] for r in out.iterations] == [0]
    conform([out.trajectory], "trajectories")


def test_a_bug_is_an_internal_error_not_a_crash():
    out, _ = run([SEARCH_1, RuntimeError("boom")])  # an engine wrapper raising outside its contract
    assert out.trajectory["stop_reason"] == "internal_error" and out.trajectory["error"] == "RuntimeError: boom"
    out, _ = run([SEARCH_1, SEARCH_2, ANSWER], controller=ScriptedController(at=1, answer_iteration=5))
    assert (
        out.trajectory["stop_reason"] == "internal_error" and "controller named iteration 5" in out.trajectory["error"]
    )


def test_a_prompt_that_cannot_be_built_is_an_internal_error():
    class NoTemplate(FakeEngine):
        def apply_chat_template(self, messages, add_generation_prompt=True):
            raise EngineError("the tokenizer in /m has no chat template")

    out, engine = run(None, engine=NoTemplate(agent_turns([ANSWER])))
    assert out.trajectory["stop_reason"] == "internal_error" and "no chat template" in out.trajectory["error"]
    assert out.iterations == [] and engine.requests == []


def test_an_outage_seen_by_the_controller_is_still_an_engine_error():
    class EngineDown:
        async def decide(self, question, history):
            raise EngineUnavailableError("judge engine unreachable")

    out, _ = run([SEARCH_1, ANSWER], controller=EngineDown())
    assert out.trajectory["stop_reason"] == "engine_error" and "judge engine unreachable" in out.trajectory["error"]


def test_context_overflow_row():
    first_prompt = SearchR1().prompt(Q.question, FakeEngine(None).apply_chat_template)
    window = FakeEngine(None).count_tokens(first_prompt) + 40  # room for turn 0, not for the documents after it
    engine = FakeEngine(agent_turns([SEARCH_1, SEARCH_2, ANSWER], probe_by_evidence), max_model_len=window)
    out, _ = run(None, engine=engine)
    traj = out.trajectory
    assert traj["stop_reason"] == "context_overflow" and "no room" in traj["error"]
    assert len(out.iterations) >= 1


def test_retrieval_error_row():
    out, _ = run([SEARCH_1], retriever=FakeRetriever(fail_on=["Hamlet author"]))
    assert out.trajectory["stop_reason"] == "retrieval_error" and "retrieval service down" in out.trajectory["error"]


def test_a_query_that_crashes_its_replica_is_a_query_crash_not_a_retrieval_error():
    out, _ = run([SEARCH_1], retriever=FakeRetriever(crash_on=["Hamlet author"]))
    traj = out.trajectory
    assert traj["stop_reason"] == "query_crash" and "QueryCrashError: in flight at 3" in traj["error"]
    assert "'Hamlet author'" in traj["error"] and [r["iteration"] for r in out.iterations] == [0]
    conform([traj], "trajectories")


def test_controller_stop_rolls_back_to_the_named_iteration():
    controller = ScriptedController(at=2, answer_iteration=1)
    out, engine = run([SEARCH_1, SEARCH_2, ANSWER], controller=controller)
    traj = out.trajectory
    assert traj["stop_reason"] == "controller" and traj["final_answer"] == "Shakespeare"
    assert len(out.iterations) == 3 and traj["n_iterations"] == 2
    assert [len(h) for h in controller.histories] == [1, 2, 3]  # called after every probe
    seen = controller.histories[-1][1]
    assert "probe_f1" not in seen and "utility" not in seen  # never the gold-based columns
    assert seen["probe_answer"] == "Shakespeare" and seen["doc_titles"] == ["Title 0", "Title 1", "Title 2"]
    assert seen["doc_texts"][0] == "passage 0 about Hamlet author"
    current, _ = run([SEARCH_1, SEARCH_2, ANSWER], controller=ScriptedController(at=1))
    assert current.trajectory["final_answer"] == "Shakespeare" and len(current.iterations) == 2


def test_probing_off():
    out, engine = run([SEARCH_1, SEARCH_2], AgentConfig(max_turns=2, probe=False))
    assert all(r["probe_answer"] is None and r["probe_f1"] is None and r["probe_tokens"] == 0 for r in out.iterations)
    assert len(engine.requests) == 2  # the two turns: nothing is generated that nobody uses
    assert out.trajectory["final_answer"] is None and out.trajectory["probe_tokens"] == 0
    conform(out.iterations, "iterations")
    out, engine = run([SEARCH_1, SEARCH_2], AgentConfig(max_turns=2, probe=False, at_limit="forced"))
    # only the forced final answer is generated with an answer trigger
    assert sum(r.prompt.endswith("<answer>") for r in engine.requests) == 1
    assert out.trajectory["final_answer"] == "William Shakespeare" and out.trajectory["probe_tokens"] == 0


def test_enforcement_regex_per_turn():
    _, engine = run([SEARCH_1, ANSWER], AgentConfig(max_turns=4, enforcement="first_search"))
    agent = [r for r in engine.requests if not r.prompt.endswith("<answer>")]
    assert "<answer>" not in agent[0].regex and "<answer>" in agent[1].regex
    assert all(r.regex is None for r in engine.requests if r.prompt.endswith("<answer>"))


def test_r1_searcher_trajectory():
    turns = [
        " I need the author. <|begin_of_query|> Hamlet\tauthor <|end_of_query|>",
        " It is Shakespeare. </think>\n\n<answer> William Shakespeare </answer>",
    ]
    agent = AgentConfig(max_turns=10)
    out, engine = run(turns, agent, protocol=R1Searcher("pyterrier"), probe=" Shakespeare </answer>", top_k=5)
    assert out.trajectory["stop_reason"] == "answer" and out.iterations[1]["query"] == "Hamlet author"
    agent = [r for r in engine.requests if not r.prompt.endswith("<answer>")]
    assert agent[1].prompt.endswith(
        "Assistant: <think>\n\n I need the author. <|begin_of_query|> Hamlet\tauthor <|end_of_query|>\n\n"
        "<|begin_of_documents|>\n(1)passage 0 about Hamlet author\n(2)passage 1 about Hamlet author\n"
        "(3)passage 2 about Hamlet author\n(4)passage 3 about Hamlet author\n"
        "(5)passage 4 about Hamlet author\n<|end_of_documents|>\n\n"
    )
    probes = [r for r in engine.requests if r.prompt.endswith("<answer>")]
    assert probes[0].prompt.endswith("Assistant: <think>\n\n I need the author.</think>\n\n<answer>")
    assert engine.requests[0].stop == ("<|im_end|>", "<|endoftext|>", "<|end_of_query|>", "</answer>")
