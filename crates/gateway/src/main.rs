//! `slotgate`: the gateway binary. Not written yet.

fn main() {
    eprintln!("slotgate: the gateway is not built yet; run slotgate-engine directly (see README)");
    std::process::exit(2);
}
