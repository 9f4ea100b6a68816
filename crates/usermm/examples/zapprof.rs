use std::time::Instant;
use usermm::mmap::*;
use usermm::{Machine, MachineConfig};
fn main() {
    let order: u32 = std::env::args().nth(1).unwrap().parse().unwrap();
    let on: bool = std::env::args().nth(2).unwrap() == "on";
    let op = std::env::args().nth(3).unwrap_or("munmap".into());
    let len = 1u64 << 30;
    let m = Machine::new(MachineConfig::single_node(len * 2, 2)).unwrap();
    m.prefault();
    m.thp.only_order(order);
    m.tunables.set_zap_batch(on);
    m.tunables.set_fork_batch(on);
    let mut ts = vec![];
    for _ in 0..15 {
        let c = m.bind(0).unwrap();
        c.new_mm().unwrap();
        let a = c
            .mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS)
            .unwrap();
        c.touch_pages(a, a + len, 1).unwrap();
        if std::env::var_os("SPLIT").is_some() {
            for b in (a..a + len).step_by(2 << 20) {
                c.mprotect(b + 4096, 4096, PROT_READ).unwrap();
                c.mprotect(b + 4096, 4096, PROT_READ | PROT_WRITE).unwrap();
            }
        }
        m.mem.drain_all_pages();
        let t = Instant::now();
        if op == "fork" {
            let ch = c.fork().unwrap();
            ts.push(t.elapsed().as_secs_f64());
            let p = c.mm().unwrap();
            c.switch_mm(&ch);
            c.exit_mm().unwrap();
            c.switch_mm(&p);
        } else {
            c.munmap(a, len).unwrap();
            ts.push(t.elapsed().as_secs_f64());
        }
        c.exit_mm().unwrap();
        m.rcu_barrier();
    }
    ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("order {order} on={on} {op}: median {:.6}", ts[ts.len() / 2]);
}
