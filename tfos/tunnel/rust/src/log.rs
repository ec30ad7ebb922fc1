//! Log lines on stderr, one per event; repetitive events at most once per period, with a count
//! of the ones left out.

use std::fmt::Display;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub fn line(msg: impl Display) {
    eprintln!("tfos-tunnel[{}]: {msg}", std::process::id());
}

/// At most one line per period for one kind of event.
pub struct Throttle {
    period: Duration,
    state: Mutex<(Option<Instant>, u64)>,
}

impl Throttle {
    pub const fn new(period: Duration) -> Self {
        Throttle { period, state: Mutex::new((None, 0)) }
    }

    pub fn log(&self, msg: impl Display) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        match st.0 {
            Some(last) if now.duration_since(last) < self.period => st.1 += 1,
            _ => {
                if st.1 > 0 {
                    line(format_args!("{msg} (and {} more like it since the last such line)", st.1));
                } else {
                    line(msg);
                }
                *st = (Some(now), 0);
            }
        }
    }
}

const TEN_S: Duration = Duration::from_secs(10);
/// Handshakes refused at the ingress.
pub static REFUSED: Throttle = Throttle::new(TEN_S);
/// Loopback-mode egress connections from another user, dropped.
pub static FOREIGN: Throttle = Throttle::new(TEN_S);
/// accept() failures.
pub static ACCEPT: Throttle = Throttle::new(TEN_S);
/// Relayed connections cut by an error (reset on both ends).
pub static RESET: Throttle = Throttle::new(Duration::from_secs(1));
