//! What happens after a container runs: exits and probe results, restarts
//! per `restartPolicy` with back-off, and stopping every container (SIGTERM,
//! grace, SIGKILL).

use super::*;

/// The tail of a failed container's log Kubernetes uses as its termination
/// message under `FallbackToLogsOnError`: at most this many bytes...
const FALLBACK_BYTES: usize = 2048;
/// ...and this many lines.
const FALLBACK_LINES: usize = 80;

impl Worker {
    /// The termination message of container `idx` that failed: the tail of
    /// its log when its `terminationMessagePolicy` is `FallbackToLogsOnError`
    /// (as a kubelet does; no message file is read here).
    fn fallback_message(&self, idx: usize, name: &str) -> Option<String> {
        let spec = self.container_spec(idx)?;
        if spec.termination_message_policy.as_deref() != Some("FallbackToLogsOnError") {
            return None;
        }
        let log = std::fs::read(logs::log_path(&self.dir, name, false)).ok()?;
        let tail = &log[log.len().saturating_sub(FALLBACK_BYTES)..];
        let text = String::from_utf8_lossy(tail);
        let lines: Vec<&str> = text.lines().collect();
        let kept = lines[lines.len().saturating_sub(FALLBACK_LINES)..].join("\n");
        let kept = kept.trim();
        (!kept.is_empty()).then(|| kept.to_string())
    }

    pub(super) fn handle(&mut self, event: Event) {
        match event {
            Event::Exited {
                init,
                idx,
                run_id,
                status,
            } => {
                let key = self.key();
                let Some(slot) = self.slots.get_mut(idx) else {
                    return;
                };
                if slot.run_id != run_id || slot.init != init {
                    return;
                }
                use std::os::unix::process::ExitStatusExt as _;
                let signal = status.signal();
                let code = status.code().unwrap_or_else(|| 128 + signal.unwrap_or(0));
                let pid = slot.pgid.take();
                lock(&self.running).remove(&slot.ctr.name);
                lock(&self.targets).remove(&slot.ctr.name);
                if let Some(pgid) = pid {
                    // The leader is gone: end the rest of the container, as a runtime would.
                    process::signal_group(pgid, libc::SIGKILL);
                    lock(&self.shared.groups).remove(&pgid);
                }
                let started_at = match &slot.ctr.run {
                    ContainerRun::Running { started_at, .. } => Some(*started_at),
                    _ => None,
                };
                let name = slot.ctr.name.clone();
                let message = (code != 0)
                    .then(|| self.fallback_message(idx, &name))
                    .flatten();
                let Some(slot) = self.slots.get_mut(idx) else {
                    return;
                };
                let run = ContainerRun::Terminated {
                    pid,
                    exit_code: code,
                    signal,
                    reason: if code == 0 {
                        "Completed".into()
                    } else {
                        "Error".into()
                    },
                    message,
                    started_at,
                    finished_at: Timestamp::now(),
                };
                tracing::info!(pod = %key, container = %slot.ctr.name, code, ?signal, "container exited");
                self.after_exit(idx, run, code);
            }
            Event::Probed {
                idx,
                run_id,
                kind,
                result,
            } => {
                let Some(slot) = self.slots.get_mut(idx) else {
                    return;
                };
                let state = match kind {
                    ProbeKind::Startup => slot.startup.as_mut(),
                    ProbeKind::Readiness => slot.readiness.as_mut(),
                    ProbeKind::Liveness => slot.liveness.as_mut(),
                };
                let Some(state) = state else { return };
                if slot.run_id != run_id {
                    return;
                }
                state.in_flight = false;
                state.next_at = Instant::now() + state.spec.period;
                match result {
                    Ok(()) => {
                        state.successes += 1;
                        state.failures = 0;
                    }
                    Err(message) => {
                        state.failures += 1;
                        state.successes = 0;
                        if state.failures == state.spec.failure_threshold {
                            let what = match kind {
                                ProbeKind::Startup => "Startup",
                                ProbeKind::Readiness => "Readiness",
                                ProbeKind::Liveness => "Liveness",
                            };
                            events::emit(
                                &self.shared,
                                &self.pod,
                                true,
                                "Unhealthy",
                                format!(
                                    "{what} probe of container {} failed: {message}",
                                    slot.ctr.name
                                ),
                            );
                        }
                        tracing::debug!(pod = %format!("{}/{}", self.ns, self.name), container = %slot.ctr.name, ?kind, %message, "probe failed");
                    }
                }
                let (ok, failed) = (
                    state.successes >= state.spec.success_threshold,
                    state.failures >= state.spec.failure_threshold,
                );
                match kind {
                    ProbeKind::Startup => {
                        if ok {
                            // Started: readiness and liveness begin now.
                            slot.ctr.started = true;
                            slot.startup = None;
                            let now = Instant::now();
                            for p in [&mut slot.readiness, &mut slot.liveness]
                                .into_iter()
                                .flatten()
                            {
                                p.next_at = now + p.spec.initial_delay;
                            }
                            slot.ctr.ready = slot.readiness.is_none();
                        } else if failed && let Some(pgid) = slot.pgid {
                            tracing::info!(container = %slot.ctr.name, "startup probe failed; killing container");
                            process::signal_group(pgid, libc::SIGKILL);
                        }
                    }
                    ProbeKind::Readiness => {
                        if ok {
                            slot.ctr.ready = true;
                        } else if failed {
                            slot.ctr.ready = false;
                        }
                    }
                    ProbeKind::Liveness => {
                        if failed && let Some(pgid) = slot.pgid {
                            tracing::info!(container = %slot.ctr.name, "liveness probe failed; killing container");
                            process::signal_group(pgid, libc::SIGKILL);
                        }
                    }
                }
            }
        }
    }

    /// Records a finished run of slot `i` and schedules a restart if the
    /// restart policy asks for one.
    pub(super) fn after_exit(&mut self, i: usize, run: ContainerRun, code: i32) {
        let policy = restart_policy(&self.pod);
        let cfg = &self.shared.config;
        let stopping = self.stopping;
        let is_init = i < self.n_init;
        let slot = &mut self.slots[i];
        slot.ctr.ready = false;
        slot.ctr.started = false;
        slot.startup = None;
        slot.readiness = None;
        slot.liveness = None;
        if stopping || slot.ephemeral {
            // Ephemeral containers are never restarted (invariant 6).
            slot.ctr.run = run;
            return;
        }
        if is_init && code == 0 {
            slot.ctr.run = run;
            self.next_init = i + 1;
            if self.next_init == self.n_init {
                for s in &mut self.slots[self.n_init..self.n_init + self.n_main] {
                    s.ctr.run = ContainerRun::waiting("ContainerCreating", None);
                    s.next_start = Some(Instant::now());
                }
            } else {
                self.slots[self.next_init].ctr.run = ContainerRun::waiting("PodInitializing", None);
            }
            return;
        }
        let restart = match policy.as_str() {
            "Never" => false,
            "OnFailure" => code != 0,
            _ => !is_init || code != 0,
        };
        if !restart {
            slot.ctr.run = run;
            if is_init {
                self.init_failed = true;
            }
            return;
        }
        let ran = slot.started.map(|t| t.elapsed()).unwrap_or_default();
        if ran > cfg.max_restart_backoff * 2 {
            slot.backoff = cfg.restart_backoff;
        }
        let delay = slot.backoff;
        slot.backoff = (slot.backoff * 2).min(cfg.max_restart_backoff);
        slot.next_start = Some(Instant::now() + delay);
        slot.ctr.last = Some(run);
        events::emit(
            &self.shared,
            &self.pod,
            true,
            "BackOff",
            format!(
                "Back-off {delay:?} restarting failed container {}",
                slot.ctr.name
            ),
        );
        slot.ctr.run = ContainerRun::waiting(
            "CrashLoopBackOff",
            Some(format!(
                "back-off {delay:?} restarting failed container={} pod={}",
                slot.ctr.name, self.name
            )),
        );
    }

    /// Stops every running container: SIGTERM, at most `grace`, SIGKILL.
    pub(super) async fn stop_all(&mut self, grace: Duration) {
        self.stopping = true;
        let running: Vec<i32> = self.slots.iter().filter_map(|s| s.pgid).collect();
        if running.is_empty() {
            return;
        }
        tracing::info!(pod = %self.key(), ?grace, "stopping containers");
        for s in self.slots.iter().filter(|s| s.pgid.is_some()) {
            events::emit(
                &self.shared,
                &self.pod,
                false,
                "Killing",
                format!("Stopping container {} (grace period {grace:?})", s.ctr.name),
            );
        }
        for pgid in &running {
            process::signal_group(*pgid, libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        self.drain_until(deadline).await;
        let left: Vec<i32> = self.slots.iter().filter_map(|s| s.pgid).collect();
        for pgid in &left {
            process::signal_group(*pgid, libc::SIGKILL);
        }
        self.drain_until(Instant::now() + KILL_WAIT).await;
        for s in &mut self.slots {
            if let Some(pgid) = s.pgid.take() {
                tracing::error!(pod = %format!("{}/{}", self.ns, self.name), pgid, "container did not exit after SIGKILL");
            }
        }
    }

    pub(super) async fn drain_until(&mut self, deadline: Instant) {
        while self.slots.iter().any(|s| s.pgid.is_some()) {
            tokio::select! {
                Some(event) = self.rx.recv() => self.handle(event),
                _ = tokio::time::sleep_until(deadline) => return,
            }
        }
    }
}
