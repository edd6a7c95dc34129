//! Events handed to their consumer by the source, not pulled from it: an
//! [`EventSource`] calls an [`EventSink`] once per event, so that a reader that
//! decides a row's op can call the consumer from that decision's branch (the
//! consumer's code for that op inlined there: [`crate::csv::CsvEvents::rows`]), where
//! an iterator gives an event whose op its consumer decides again.

use std::borrow::Borrow;
use std::ops::ControlFlow;

use crate::Event;

/// What takes events one at a time (a replay's engine), and may stop the source.
pub trait EventSink<E> {
    /// Why the sink stopped the source.
    type Stop;
    /// Takes the next event; `Break` stops the source after it (the events after
    /// it stay in the source).
    fn event(&mut self, event: E) -> ControlFlow<Self::Stop>;
}

/// What hands its events, in order, to an [`EventSink`]. Every iterator of events
/// is one (its `next` in a loop); a reader may hand each kind of row from its own
/// branch ([`crate::csv::CsvEvents::rows`]).
pub trait EventSource {
    /// The events as the source holds them (an [`Event`] or a reference to one).
    type Item: Borrow<Event>;
    /// Hands the events to `sink` until they end (`Continue`) or the sink stops
    /// (its `Break`, the events after that one left in the source).
    fn feed<K: EventSink<Self::Item>>(&mut self, sink: &mut K) -> ControlFlow<K::Stop>;
}

impl<I: Iterator + ?Sized> EventSource for I
where
    I::Item: Borrow<Event>,
{
    type Item = I::Item;

    // `I::next` itself, not `<&mut I>::next` (what a `for` loop over `&mut *self`
    // calls): a reader's `next` can inline here.
    #[allow(clippy::while_let_on_iterator)]
    #[inline(always)]
    fn feed<K: EventSink<I::Item>>(&mut self, sink: &mut K) -> ControlFlow<K::Stop> {
        while let Some(event) = self.next() {
            sink.event(event)?;
        }
        ControlFlow::Continue(())
    }
}
