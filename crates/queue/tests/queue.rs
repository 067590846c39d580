use std::collections::HashSet;
use std::sync::Arc;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use dflash_queue::{BoundedQueue, Queue, QueueError};

const SHORT: Duration = Duration::from_millis(20);
const LONG: Duration = Duration::from_secs(10);

#[test]
fn fifo_order_and_counts() {
    let q = BoundedQueue::new("fifo", 8);
    for i in 0..8 {
        q.push(i, SHORT).unwrap();
    }
    assert_eq!(q.len(), 8);
    for i in 0..8 {
        assert_eq!(q.pop(SHORT).unwrap(), i);
    }
    let s = q.stats();
    assert_eq!((s.depth, s.capacity, s.pushed, s.popped), (0, 8, 8, 8));
    assert_eq!(q.high_water(), 8);
    assert_eq!(q.name(), "fifo");
}

#[test]
fn zero_capacity_is_one() {
    let q = BoundedQueue::new("z", 0);
    assert_eq!(q.capacity(), 1);
    q.push(1, SHORT).unwrap();
    assert!(q.try_push(2).is_err());
}

#[test]
fn push_timeout_gives_item_back() {
    let q = BoundedQueue::new("full", 2);
    q.push("a".to_string(), SHORT).unwrap();
    q.push("b".to_string(), SHORT).unwrap();
    let t0 = Instant::now();
    let (item, err) = q
        .push("c".to_string(), Duration::from_millis(30))
        .unwrap_err();
    assert!(t0.elapsed() >= Duration::from_millis(30));
    assert_eq!(item, "c");
    assert_eq!(err, QueueError::Timeout("full".into()));
    assert!(err.to_string().contains("full"));
    // A timed-out wait is a stall too.
    assert!(q.stats().push_wait >= Duration::from_millis(25));
    let (item, err) = q.try_push("d".to_string()).unwrap_err();
    assert_eq!(
        (item.as_str(), err),
        ("d", QueueError::Timeout("full".into()))
    );
    assert_eq!(q.stats().pushed, 2);
}

#[test]
fn pop_timeout_on_empty() {
    let q: BoundedQueue<u32> = BoundedQueue::new("empty", 2);
    let t0 = Instant::now();
    assert_eq!(
        q.pop(Duration::from_millis(30)),
        Err(QueueError::Timeout("empty".into()))
    );
    assert!(t0.elapsed() >= Duration::from_millis(30));
    assert_eq!(q.try_pop(), Err(QueueError::Timeout("empty".into())));
    assert!(q.stats().pop_wait >= Duration::from_millis(25));
}

#[test]
fn capacity_blocks_then_unblocks() {
    let q = Arc::new(BoundedQueue::new("cap", 1));
    q.push(1u32, SHORT).unwrap();
    let q2 = q.clone();
    let producer = thread::spawn(move || {
        let t0 = Instant::now();
        q2.push(2u32, LONG).unwrap();
        t0.elapsed()
    });
    thread::sleep(Duration::from_millis(60));
    // Still blocked: nothing was added.
    assert_eq!(q.len(), 1);
    assert_eq!(q.stats().pushed, 1);
    assert_eq!(q.pop(SHORT).unwrap(), 1);
    let blocked_for = producer.join().unwrap();
    assert!(blocked_for >= Duration::from_millis(50), "{blocked_for:?}");
    assert_eq!(q.pop(SHORT).unwrap(), 2);
    let s = q.stats();
    assert_eq!((s.pushed, s.popped, s.depth), (2, 2, 0));
    // Producer stall was recorded; the consumer never waited.
    assert!(s.push_wait >= Duration::from_millis(50), "{s:?}");
    assert_eq!(s.pop_wait, Duration::ZERO);
    assert_eq!(q.high_water(), 1);
}

#[test]
fn consumer_starvation_is_counted() {
    let q = Arc::new(BoundedQueue::new("starve", 4));
    let q2 = q.clone();
    let consumer = thread::spawn(move || q2.pop(LONG));
    thread::sleep(Duration::from_millis(60));
    q.push(7u8, SHORT).unwrap();
    assert_eq!(consumer.join().unwrap(), Ok(7));
    let s = q.stats();
    assert!(s.pop_wait >= Duration::from_millis(50), "{s:?}");
    assert_eq!(s.push_wait, Duration::ZERO);
}

#[test]
fn close_wakes_blocked_consumers() {
    let q: Arc<BoundedQueue<u32>> = Arc::new(BoundedQueue::new("wake-pop", 2));
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let q = q.clone();
            thread::spawn(move || {
                let t0 = Instant::now();
                (q.pop(LONG), t0.elapsed())
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(50));
    q.close();
    for w in waiters {
        let (r, took) = w.join().unwrap();
        assert_eq!(r, Err(QueueError::Closed("wake-pop".into())));
        assert!(took < Duration::from_secs(5));
    }
}

#[test]
fn close_wakes_blocked_producers_and_gives_items_back() {
    let q = Arc::new(BoundedQueue::new("wake-push", 1));
    q.push(0u32, SHORT).unwrap();
    let waiters: Vec<_> = (1..=3u32)
        .map(|i| {
            let q = q.clone();
            thread::spawn(move || q.push(i, LONG))
        })
        .collect();
    thread::sleep(Duration::from_millis(50));
    q.close();
    let mut back: Vec<u32> = waiters
        .into_iter()
        .map(|w| {
            let (item, err) = w.join().unwrap().unwrap_err();
            assert_eq!(err, QueueError::Closed("wake-push".into()));
            item
        })
        .collect();
    back.sort();
    assert_eq!(back, vec![1, 2, 3]);
    // Pushing into a closed queue is refused at once.
    let (item, err) = q.push(9, LONG).unwrap_err();
    assert_eq!((item, err), (9, QueueError::Closed("wake-push".into())));
}

#[test]
fn drained_then_closed() {
    let q = BoundedQueue::new("drain", 4);
    q.push(1, SHORT).unwrap();
    q.push(2, SHORT).unwrap();
    q.close();
    q.close(); // idempotent
    assert!(q.is_closed());
    assert_eq!(q.pop(SHORT), Ok(1));
    assert_eq!(q.pop(SHORT), Ok(2));
    assert_eq!(q.pop(SHORT), Err(QueueError::Closed("drain".into())));
    assert_eq!(q.try_pop(), Err(QueueError::Closed("drain".into())));
    let s = q.stats();
    assert_eq!((s.pushed, s.popped, s.depth), (2, 2, 0));
}

#[test]
fn mpmc_every_item_exactly_once() {
    const PRODUCERS: usize = 4;
    const CONSUMERS: usize = 4;
    const ITEMS: usize = 10_000;
    let q = Arc::new(BoundedQueue::new("mpmc", 8));
    let start = Arc::new(Barrier::new(PRODUCERS + CONSUMERS));

    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let (q, start) = (q.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                let mut last = None;
                for i in (p..ITEMS).step_by(PRODUCERS) {
                    q.push((p, i), LONG).unwrap();
                    last = Some(i);
                }
                last
            })
        })
        .collect();
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            let (q, start) = (q.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                let mut got = Vec::new();
                loop {
                    match q.pop(LONG) {
                        Ok(x) => got.push(x),
                        Err(QueueError::Closed(_)) => break got,
                        Err(e) => panic!("unexpected {e}"),
                    }
                }
            })
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    q.close();
    let mut seen = HashSet::new();
    let mut total = 0;
    for c in consumers {
        let got = c.join().unwrap();
        // Items of one producer reach one consumer in the order they were pushed.
        for p in 0..PRODUCERS {
            let mine: Vec<usize> = got.iter().filter(|x| x.0 == p).map(|x| x.1).collect();
            assert!(mine.windows(2).all(|w| w[0] < w[1]));
        }
        total += got.len();
        for (_, i) in got {
            assert!(seen.insert(i), "item {i} delivered twice");
        }
    }
    assert_eq!(total, ITEMS);
    assert_eq!(seen.len(), ITEMS);
    let s = q.stats();
    assert_eq!(
        (s.pushed, s.popped, s.depth),
        (ITEMS as u64, ITEMS as u64, 0)
    );
    assert!(q.high_water() <= 8);
}

#[test]
fn usable_as_trait_object() {
    let q: Arc<dyn Queue<Vec<f32>>> = Arc::new(BoundedQueue::new("dyn", 2));
    q.push(vec![1.0], SHORT).unwrap();
    assert_eq!(q.pop(SHORT).unwrap(), vec![1.0]);
    assert_eq!(q.stats().capacity, 2);
}
