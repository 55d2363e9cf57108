"""Reporting: a job that ended is reported from its supervisor's `Ended` (with its log, outputs, metrics, a task's
value and a campaign's results), and sent with the others that ended in the same look, the last call carrying the
claim for the slots they free. The spool's rule (docs/worker.md, "Reports and the spool"): a report is spooled when
its job ran `DURABLE_AFTER_SECONDS` or longer, or when it cannot be sent at once; a short job's goes straight out.
The supervisor forgets a job's end (`ack`) once its report is answered or spooled.
"""

from __future__ import annotations

import base64
import errno
import logging
import os
from typing import Any

from piloop_common.bytecaps import result_refusal
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
from piloop_worker.jobfiles import JobFiles, files_under
from piloop_worker.records import DURABLE_AFTER_SECONDS
from piloop_worker.relay import Relay
from piloop_worker.repos import Repos, parse_score
from piloop_worker.slotset import Slots
from piloop_worker.spool import Spool

log = logging.getLogger("piloop.worker")


class Reporter:
    """The worker's reports: built from a job's end, spooled when the rule says, sent (with the claim for the slots
    they free, `claimer`), and the job let go once answered."""

    def __init__(
        self,
        ctx: WorkerContext,
        *,
        api: ApiClient,
        holdings: Holdings,
        slots: Slots,
        claimer: Claimer,
        store: Store,
        spool: Spool,
        repos: Repos,
        cgroups: Cgroups,
        relay: Relay,
    ) -> None:
        self.ctx, self.api, self.holdings, self.slots, self.claimer = ctx, api, holdings, slots, claimer
        self.store, self.spool, self.repos, self.cgroups = store, spool, repos, cgroups
        self.relay = relay

    def build(self, h: Held) -> None:
        """The report of `h`, whose job ended (`h.ended`): kept on `h` to be sent (`send_all`, `send`), spooled first
        when its job ran long enough; its slot free once this returns."""
        ended = h.ended
        assert ended is not None
        rec = ended.exit
        self.relay.remove(h.job)
        files = self.slots.files(h.slot)
        outcome, reason = rec.outcome()
        if outcome == "failed" and rec.exit_code != 0 and not rec.reason and files.full():
            reason = "disk_full: the worker's dir is full (No space left on device)"
        task = h.record is not None and h.record.spec.runner == "task"
        inline: dict[str, str] = {}
        try:
            outcome, reason, campaign = self._campaign_results(h, files, outcome, reason)
            h.shipper.upload(self.store, self.ctx.timed.log_max_bytes)
            if task:
                found: list[tuple[str, str]] = []
                name = f"result.{self._serializer(h)}"
                if ended.result is not None:
                    inline[name] = base64.b64encode(ended.result).decode()
                elif ended.result_file is not None and os.path.exists(ended.result_file):
                    too_big = result_refusal(os.stat(ended.result_file).st_size, self.ctx.timed.result_max_bytes)
                    if too_big:
                        if outcome == "succeeded":
                            outcome, reason = "failed", too_big
                    else:
                        found.append((name, ended.result_file))
            else:
                found = files_under(files.outputs)
            outputs = {name: self.store.put_file(path) for name, path in found}
            if task and ended.error is not None:  # what it raised, for `AsyncResult.traceback`
                outputs["error.json"] = self.store.put_bytes(ended.error)
            metrics = None
            if rec.duration_seconds >= 1.0 and files.slot.metrics.exists() and files.slot.metrics.stat().st_size:
                metrics = self.store.put_file(files.slot.metrics)
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
        if rec.duration_seconds >= DURABLE_AFTER_SECONDS:
            self._spool(h, report)  # before it is sent: a worker that dies now sends it at its next start
        h.report = report
        files.empty()
        if files.full():  # what a job left in `work/` is its supervisor's to remove at the next start: not so long
            files.slot.empty_work()
        if h.cgroup is not None:
            self.cgroups.give(h.cgroup)
            h.cgroup = None
        self.claimer.soon()  # its slot is free
        log.info("event=job.ended job=%s outcome=%s reason=%r exit_code=%s", h.job, outcome, reason, rec.exit_code)

    def _serializer(self, h: Held) -> str:
        """A task's serializer, its arguments' (`args.<serializer>`), which its value is in too."""
        names = {*h.record.spec.inputs, *h.record.spec.inline_inputs} if h.record else set()
        return "pickle" if "args.pickle" in names else "json"

    def _spool(self, h: Held, report: ReportRequest) -> None:
        """`report` in the spool, and its job's end forgotten by the supervisor, which need not keep it now."""
        try:
            self.spool.write(report)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            # sent all the same: a worker that dies before the answer leaves the lease to expire, and the job runs
            # again, which is better than a job held `running` until the spool's filesystem has room
            log.warning("event=job.report_unspooled job=%s reason=disk_full error=%s", h.job, e)
            return
        h.spooled = True
        self.slots.ack(h.slot, h.generation)

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
            if not h.spooled and h.report is not None:
                self._spool(h, h.report)  # it could not be sent at once: it waits in the spool
            h.tries += 1
            h.next_try = clock.now() + min(0.5 * 2**h.tries, 30.0)
            return
        self.holdings.remove(h)  # the heartbeat's answers act only on held jobs
        if not h.spooled:
            self.slots.ack(h.slot, h.generation)

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

    def _campaign_results(self, h: Held, files: JobFiles, outcome: str, reason: str) -> tuple[str, str, dict[str, Any]]:
        """An agent's commits and workspace writes, an evaluation's score; the outcome and reason they leave.
        Only a run that succeeded is taken back or scored: partial output never is."""
        camp = h.record.spec.campaign if h.record else None
        if camp is None:
            return outcome, reason, {}
        out: dict[str, Any] = {"fetched_bytes": h.record.fetched_bytes if h.record else 0}
        if outcome != "succeeded":
            return outcome, reason, out
        if camp.collect:
            try:
                out["head"], out["bundle"], out["workspace"] = self.repos.collect(camp, files.repo, files.workspace)
            except GitError as e:
                return "failed", f"the run's commits cannot be read: {e.message}", out
        if camp.score:
            out["score"] = parse_score(files.slot.output_log)
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
