"""The page's events, read from the built Blocks (no browser): every query and every step chained after it runs
the user's latest request (demo/ui.py, LATEST and CHAINED)."""


def _chains(demo):
    """id -> the id of the event that starts its chain (itself for an event that follows none)."""
    fns = demo.fns

    def root(i):
        while fns[i].trigger_after is not None:
            i = fns[i].trigger_after
        return i

    return {i: root(i) for i in fns}


def test_every_query_and_every_step_after_it_runs_the_latest_request(gallery_engine):
    from demo.ui import build_demo

    demo = build_demo(gallery_engine.settings, engine=gallery_engine)
    try:
        fns, root = demo.fns, _chains(demo)
        # a query: any search (they share the "search" pool), a compare, the query restored when the page loads
        queries = {i for i, f in fns.items() if f.concurrency_id == "search" or f.api_name == "compare"
                   or f.targets[0][1] == "load"}
        starts = {root[i] for i in queries}
        events = sorted(fns[i].targets[0][1] for i in starts)
        # button, Enter and an example; compare; a recent query and the page's URL; the own-photos button and Enter
        assert events == ["click", "click", "click", "click", "load", "select", "submit", "submit"], events
        in_chains = [i for i in fns if root[i] in starts]
        # the page load runs once per page: there is no earlier request its trigger mode could drop
        wrong = [(i, fns[i].targets, fns[i].trigger_mode) for i in in_chains
                 if fns[i].trigger_mode != "always_last" and fns[i].targets[0][1] != "load"]
        assert not wrong, f"a query or a step after it drops the latest request: {wrong}"
        steps = [i for i in in_chains if fns[i].trigger_after is not None and i not in queries]
        assert len(steps) >= 3 * len(starts)  # the record, the values searched, the share link, ...
        quiet = [(i, fns[i].show_progress, fns[i].api_visibility) for i in steps
                 if fns[i].show_progress != "hidden" or fns[i].api_visibility == "public"]
        assert not quiet, f"a step after a query shows a progress overlay or is in the API: {quiet}"
    finally:
        demo.close()
