//! `tfos-tunnel`: reads one JSON config line on stdin, prints `READY <port> netns|loopback ...`
//! or `FAILED <reason>`, serves until stdin's EOF or SIGTERM/SIGINT.

fn main() {
    std::process::exit(tfos_tunnel::tunnel::run());
}
