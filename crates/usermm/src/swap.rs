//! The parts of mm/swap.c the model has: moving folios between the states
//! reclaim reads (here, only lazyfree; the LRU lists come with reclaim).

use crate::machine::OnCpu;
use crate::phys::memmap::pg;
use crate::phys::Folio;
use crate::vmstat::Event;

/// `folio_mark_lazyfree`: an anon, swap-backed folio stops being swap-backed
/// (reclaim may discard it while it stays clean).
pub fn folio_mark_lazyfree(oncpu: &OnCpu, folio: Folio) {
    let mem = oncpu.mem();
    let head = folio.head(mem);
    if folio.test_anon(mem) && head.test(pg::SWAPBACKED) {
        head.clear(pg::SWAPBACKED);
        head.set(pg::LAZYFREE);
        oncpu
            .vmstat()
            .count(oncpu.id(), Event::PGLAZYFREE, folio.nr_pages(mem));
    }
}
