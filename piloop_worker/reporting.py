"""Reporting: a job that ended is reported from its exit record (with its log, outputs, metrics and a campaign's
results), spooled before it is sent, and sent with the others that ended in the same look, the last call carrying
the claim for the slots they free. Its dir and cgroup are given back once the server answered.
"""

from __future__ import annotations

import errno
import logging
from pathlib import Path
from typing import Any

from piloop_common.cas import Store
from piloop_common.errors import BadRequest, PiloopError, Refused, StoreError, from_payload
from piloop_common.gitrepo import GitError
from piloop_common.protocol.report import (
    REPORTS_PER_CALL,
    ReportRequest,
    ReportResponse,
    ReportsRequest,
    ReportsResponse,
    Usage,
)
from piloop_common.protocol.worker import PROTOCOL, ClaimRequest, ClaimResponse
from piloop_common.sdk.client import ApiClient
from piloop_worker import clock
from piloop_worker.cgroups import Cgroups
from piloop_worker.claiming import EVALUATIONS_PER_CLAIM, Claimer
from piloop_worker.context import WorkerContext
from piloop_worker.held import Held
from piloop_worker.holdings import Holdings
from piloop_worker.jobdir import JobDir, files_under
from piloop_worker.relay import Relay
from piloop_worker.repos import Repos, parse_score
from piloop_worker.results import carried, within_cap
from piloop_worker.shimhost import ShimHost
from piloop_worker.shimproto import ExitRecord, StopReason
from piloop_worker.sparedirs import SpareDirs
from piloop_worker.spool import Spool

log = logging.getLogger("piloop.worker")


class Reporter:
    """The worker's reports: built from a job's exit record, spooled, sent (with the claim for the slots they free,
    `claimer`), and the job let go once answered."""

    def __init__(
        self,
        ctx: WorkerContext,
        *,
        api: ApiClient,
        holdings: Holdings,
        claimer: Claimer,
        store: Store,
        spool: Spool,
        repos: Repos,
        cgroups: Cgroups,
        host: ShimHost,
        relay: Relay,
        workdir: Path,
        spare: SpareDirs | None,
    ) -> None:
        self.ctx, self.api, self.holdings, self.claimer = ctx, api, holdings, claimer
        self.store, self.spool, self.repos, self.cgroups, self.host = store, spool, repos, cgroups, host
        self.relay, self.workdir, self.spare = relay, workdir, spare

    def build(self, h: Held) -> None:
        """The report of `h`, whose job ended: spooled, and kept on `h` to be sent (`send_all`, `send`)."""
        rec = h.jd.exit_record() or ExitRecord(reason="the job's exit record cannot be read")
        # its shim is idle (the shim's word said so first, unless it was lost), or gone, or ends
        self.host.ended(h.jd.root.name, last=rec.lost or rec.stopped is StopReason.SHIM_TERMINATED)
        outcome, reason = rec.outcome()
        try:
            outcome, reason, campaign = self._campaign_results(h, outcome, reason)
            h.shipper.upload(self.store, self.ctx.timed.log_max_bytes)
            files, too_big = within_cap(h.record, files_under(h.jd.outputs), self.ctx.timed.result_max_bytes)
            if too_big and outcome == "succeeded":
                outcome, reason = "failed", too_big
            files, inline = carried(h.record, files)
            outputs = {name: self.store.put_file(path) for name, path in files}
            metrics = self.store.put_file(h.jd.metrics) if h.jd.metrics.exists() else None
        except (StoreError, PiloopError, OSError) as e:
            log.warning("event=job.report_deferred job=%s error=%s", h.job, e)
            self.ctx.unreachable(e)
            return
        report = ReportRequest(
            protocol=PROTOCOL,
            report_id=h.lease.report_id,
            job=h.lease.job,
            token=h.lease.token,
            outcome=outcome,
            exit_code=rec.exit_code,
            signal=rec.signal,
            oom=rec.oom,
            reason=reason,
            usage=Usage(**rec.usage._asdict()),
            log=list(h.shipper.chunks),
            outputs=outputs,
            inline_outputs=inline,
            metrics=metrics,
            duration_seconds=rec.duration_seconds,
            error=list(rec.error),
            **campaign,
        )
        try:
            self.spool.write(report)  # before it is sent: a worker that dies now sends it at its next start
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            # sent all the same: a worker that dies before the answer leaves the lease to expire, and the job runs
            # again, which is better than a job held `running` until the spool's filesystem has room
            log.warning("event=job.report_unspooled job=%s reason=disk_full error=%s", h.job, e)
        h.report = report
        log.info("event=job.ended job=%s outcome=%s reason=%r exit_code=%s", h.job, outcome, reason, rec.exit_code)

    def send_all(self, ready: list[Held]) -> None:
        """The reports of jobs that ended since the last look, up to 64 a call, the last call carrying the claim for
        the slots they free: a busy worker's round is one call, not a report and a claim."""
        if not ready:
            return
        ask = (
            None
            if self.ctx.stopping.is_set() or self.ctx.refused is not None
            else self.claimer.ask(wait=0.0, most=max(EVALUATIONS_PER_CLAIM, len(ready)))
        )
        if ask is None and len(ready) == 1:
            self.send(ready[0])
            return
        for i in range(0, len(ready), REPORTS_PER_CALL):
            batch = ready[i : i + REPORTS_PER_CALL]
            carried = ask if i + REPORTS_PER_CALL >= len(ready) else None  # the claim rides the last call
            answers, got = self.send_reports(
                [h.report for h in batch if h.report is not None], carried[0] if carried is not None else None
            )
            for h, answer in zip(batch, answers, strict=True):
                try:
                    self._sent(h, answer)
                except OSError as e:
                    log.warning("event=job.disk_error job=%s worker=%s error=%s", h.job, self.ctx.name, e)
            if carried is not None and got is not None:
                self.claimer.claimed(got, *carried)

    def send(self, h: Held) -> None:
        assert h.report is not None
        self._sent(h, self.send_report(h.report))

    def _sent(self, h: Held, answer: str | None) -> None:
        if answer is None:
            h.tries += 1
            h.next_try = clock.now() + min(0.5 * 2**h.tries, 30.0)
            return
        self.holdings.remove(h, lambda: h.jd.remove(self.spare))  # the heartbeat's answers act only on held jobs
        self.relay.remove(h.job)
        if h.cgroup is not None:
            self.cgroups.give(h.cgroup)
        self.claimer.soon()  # a slot is free

    def send_report(self, report: ReportRequest) -> str | None:
        """Send one spooled report; its answer (and the spool file gone), or None to try again later."""
        try:
            self.store.flush()  # the blobs it names first: kept by a cached CAS while its remote was away
            got: ReportResponse = self.api.call(
                "POST",
                "/v1/worker/report",
                report,
                model=ReportResponse,
                timeout=self.ctx.timed.request_timeout_seconds,
            )
        except Refused as e:
            self.ctx.refuse(e.message)
            return None
        except BadRequest as e:
            log.error("event=job.report_refused job=%s report=%s error=%s", report.job, report.report_id, e.message)
            self.spool.set_aside(report.report_id)
            return "bad"
        except (PiloopError, OSError) as e:
            self.ctx.unreachable(e)
            return None
        self.spool.remove(report.report_id)
        log.info("event=job.reported job=%s outcome=%s answer=%s", report.job, report.outcome, got.answer)
        return got.answer

    def send_reports(
        self, reports: list[ReportRequest], claim: ClaimRequest | None = None
    ) -> tuple[list[str | None], ClaimResponse | None]:
        """Send spooled reports in one call, and `claim` after them; each report's answer (its spool file gone), or
        None to try it again later, and the claim's answer (None: not claimed, the loop claims alone)."""
        try:
            self.store.flush()
            got: ReportsResponse = self.api.call(
                "POST",
                "/v1/worker/reports",
                ReportsRequest(protocol=PROTOCOL, reports=reports, claim=claim),
                model=ReportsResponse,
                timeout=self.ctx.timed.request_timeout_seconds,
            )
        except Refused as e:
            self.ctx.refuse(e.message)
            return [None] * len(reports), None
        except BadRequest:
            # the call as a whole refused (or a server without claims in reports): each alone says which
            return [self.send_report(r) for r in reports], None
        except (PiloopError, OSError) as e:
            self.ctx.unreachable(e)
            return [None] * len(reports), None
        out: list[str | None] = []
        for report, a in zip(reports, got.answers, strict=True):
            if a.error is None:
                self.spool.remove(report.report_id)
                log.info("event=job.reported job=%s outcome=%s answer=%s", report.job, report.outcome, a.answer)
                out.append(a.answer)
            elif isinstance(from_payload({"error": a.error, "message": a.message}, 400), BadRequest):
                log.error("event=job.report_refused job=%s report=%s error=%s", report.job, report.report_id, a.message)
                self.spool.set_aside(report.report_id)
                out.append("bad")
            else:
                self.ctx.unreachable(from_payload({"error": a.error, "message": a.message}, 500))
                out.append(None)
        return out, got.claim

    def send_spool(self) -> None:
        """Send every spooled report that no job of ours is sending right now."""
        mine = self.holdings.report_ids()
        for report in self.spool.pending():
            if report.report_id in mine:
                continue
            if self.send_report(report) is None:
                return
            JobDir.for_lease(self.workdir, report.job, report.token).remove()

    def _campaign_results(self, h: Held, outcome: str, reason: str) -> tuple[str, str, dict[str, Any]]:
        """An agent's commits and workspace writes, an evaluation's score; the outcome and reason they leave.
        Only a run that succeeded is taken back or scored: partial output never is."""
        camp = h.record.spec.campaign if h.record else None
        if camp is None:
            return outcome, reason, {}
        out: dict[str, Any] = {"fetched_bytes": h.jd.read_fetched()}
        if outcome != "succeeded":
            return outcome, reason, out
        if camp.collect:
            try:
                out["head"], out["bundle"], out["workspace"] = self.repos.collect(camp, h.jd.work, h.jd.workspace)
            except GitError as e:
                return "failed", f"the run's commits cannot be read: {e.message}", out
        if camp.score:
            out["score"] = parse_score(h.jd.output_log)
            if out["score"] is None:
                return (
                    "failed",
                    (
                        "no score: the eval command's last line must be `score=<number>` or a JSON "
                        'object with a numeric "score"'
                    ),
                    out,
                )
        return outcome, reason, out
